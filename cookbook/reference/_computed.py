"""A reference computed here: a transformers forward pass (CPU, fp32) in the image's environment, run as a
long-lived subprocess speaking JSON lines, and the registry that keeps one per checkpoint and stops them all."""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from ..image import ImageEnv, cache_dir, computed_key
from ._types import ReferenceError, RefScore, _now, _position

FORWARD_SCRIPT = Path(__file__).parent.with_name("_reference_forward.py")
# Seconds the computed reference may take: loading the model, and per prompt token on top of a base (fp32 on a
# shared 2-vCPU machine runs a 135M model at roughly 200 to 600 prompt tokens/s).
LOAD_TIMEOUT_S = 600.0
SCORE_BASE_TIMEOUT_S = 120.0
SCORE_SECONDS_PER_TOKEN = 0.05


SCORE_CACHE = "reference-scores-v1"


class ScoreCache:
    """Scores already computed for one checkpoint, kept in the cache folder: an fp32 forward pass of the same weights
    on the same ids in the same environment gives the same answer, so a later notebook, run or demo reads it instead
    of loading the model again. Keyed by the checkpoint's files (names, sizes, mtimes), the image's Python and the
    forward script, so a rebuilt checkpoint or image never reads another's scores."""

    def __init__(self, checkpoint: Path, image: ImageEnv) -> None:
        self.folder = cache_dir() / SCORE_CACHE / computed_key(checkpoint, image, FORWARD_SCRIPT.read_bytes())[:24]

    @staticmethod
    def key(prompt_ids: list[int], max_new_tokens: int, top_k: int) -> str:
        return hashlib.sha256(json.dumps([prompt_ids, max_new_tokens, top_k]).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.folder / f"{key}.json").read_text()))
        except (OSError, ValueError):
            return None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Written atomically (a reader never sees half an entry); a full disk only costs the next run's time."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(entry))
            tmp.replace(self.folder / f"{key}.json")
        except OSError:
            return


class ComputedReference:
    """A transformers forward pass (CPU, fp32) in the image's environment, one long-lived subprocess per checkpoint.

    The model loads on first use; `close()` (or leaving the `with` block, or the end of the process) stops it.
    Requests are serialised: one forward pass at a time."""

    def __init__(self, checkpoint: Path, image: ImageEnv, label: str | None = None) -> None:
        self.checkpoint = Path(checkpoint)
        self.image = image
        self.label = label or self.checkpoint.name
        self.info: dict[str, Any] = {}
        self.started_at = ""
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._lock = threading.Lock()
        self._next_id = 0
        self.scores: ScoreCache | None = None

    @property
    def source(self) -> str:
        info = self.info
        if not info:
            return (
                f"computed here: transformers forward pass of {self.label} ({self.checkpoint}), CPU, fp32, in the "
                f"image's environment ({self.image.python})"
            )
        return (
            f"computed here: transformers {info.get('transformers')} (torch {info.get('torch')}) forward pass of "
            f"{self.label} ({info.get('architecture')}, checkpoint {self.checkpoint}), CPU ({info.get('cpu')}, "
            f"{info.get('threads')} threads), fp32, in the image's environment, started {self.started_at}"
        )

    def can_score(self, prompt_ids: list[int]) -> bool:
        return bool(prompt_ids)

    def __enter__(self) -> "ComputedReference":
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        if not (self.checkpoint / "config.json").exists():
            raise ReferenceError(f"{self.checkpoint}: no config.json (not a checkpoint folder)")
        env = self.image.env()
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # -I: the script's folder (this package) must not shadow the standard library.
        try:
            self._proc = subprocess.Popen(
                [str(self.image.python), "-I", str(FORWARD_SCRIPT), str(self.checkpoint)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, bufsize=1,
            )
        except OSError as exc:
            raise ReferenceError(f"reference forward pass: cannot start {self.image.python} ({exc.strerror})") from None
        self._lines = queue.Queue()
        self._stderr = []
        threading.Thread(target=self._pump_stdout, args=(self._proc,), daemon=True).start()
        threading.Thread(target=self._pump_stderr, args=(self._proc,), daemon=True).start()
        self.started_at = _now()
        first = self._read(LOAD_TIMEOUT_S, "loading the model")
        if not first.get("ready"):
            self.close()
            raise ReferenceError(f"reference forward pass of {self.checkpoint} did not start: {first.get('error')}")
        self.info = dict(first.get("info") or {})
        COMPUTED._started(self)

    def _pump_stdout(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _pump_stderr(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self._stderr.append(line.rstrip())
            del self._stderr[:-20]

    def _read(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise ReferenceError(f"reference forward pass: no answer within {timeout_s:.0f} s ({what})")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                tail = " | ".join(self._stderr[-3:])
                self._proc = None
                raise ReferenceError(f"reference forward pass exited while {what}: {tail}")
            line = line.strip()
            if line.startswith("{"):
                return dict(json.loads(line))

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        """The forward pass's answer, from the score cache when this checkpoint already answered these ids."""
        if self.scores is None and (self.checkpoint / "config.json").exists():
            self.scores = ScoreCache(self.checkpoint, self.image)
        key = ScoreCache.key(list(prompt_ids), max_new_tokens, top_k)
        cached = self.scores.get(key) if self.scores is not None else None
        if cached is not None and not self.info:
            self.info, self.started_at = dict(cached.get("info") or {}), str(cached.get("started_at") or "")
        answer = cached["answer"] if cached is not None else self._computed(prompt_ids, max_new_tokens, top_k)
        if cached is None and self.scores is not None:
            self.scores.put(key, {"info": self.info, "started_at": self.started_at, "answer": answer})
        return RefScore(
            source=self.source,
            prompt=[_position(p) for p in answer["prompt"]],
            greedy=[p for p in (_position(g) for g in answer["greedy"]) if p is not None],
        )

    def _computed(self, prompt_ids: list[int], max_new_tokens: int, top_k: int) -> dict[str, Any]:
        with self._lock:
            self.start()
            assert self._proc is not None and self._proc.stdin is not None
            self._next_id += 1
            request = {
                "id": self._next_id, "prompt_ids": list(prompt_ids), "max_new_tokens": max_new_tokens, "top_k": top_k
            }
            try:
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._proc = None
                raise ReferenceError("reference forward pass is gone (broken pipe)") from None
            timeout = SCORE_BASE_TIMEOUT_S + SCORE_SECONDS_PER_TOKEN * (len(prompt_ids) + 20 * max_new_tokens)
            answer = self._read(timeout, f"scoring {len(prompt_ids)} tokens")
        if answer.get("error"):
            raise ReferenceError(f"reference forward pass failed on {len(prompt_ids)} tokens: {answer['error']}")
        return answer

    def tokenize(self, text: str) -> list[int]:
        """Token ids from the checkpoint's own tokenizer (for recording without a server)."""
        with self._lock:
            self.start()
            assert self._proc is not None and self._proc.stdin is not None
            self._next_id += 1
            self._proc.stdin.write(json.dumps({"id": self._next_id, "text": text}) + "\n")
            self._proc.stdin.flush()
            answer = self._read(SCORE_BASE_TIMEOUT_S, "tokenizing")
        if answer.get("error"):
            raise ReferenceError(f"reference tokenizer failed: {answer['error']}")
        return [int(t) for t in answer["tokens"]]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        COMPUTED._stopped(self)
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=10)


class ComputedReferences:
    """This process's computed references: one per checkpoint, so a run loads each model once for every check, and
    every started one (also those made directly, as `cookbook reference record` does), so `close_all` stops them.

    Whoever ends a run calls `close_all()`. One atexit registration (below) calls it again as a safety net: a
    notebook kernel that is shut down or restarted in the middle of a run never reaches that call, and each
    forward-pass subprocess (a model held in fp32) would outlive it."""

    def __init__(self) -> None:
        self._by_checkpoint: dict[str, ComputedReference] = {}
        self._live: set[ComputedReference] = set()

    def get(self, checkpoint: Path, image: ImageEnv, label: str | None = None) -> ComputedReference:
        """The computed reference of `checkpoint` (made on first use, started on its first score)."""
        key = str(Path(checkpoint).resolve())
        ref = self._by_checkpoint.get(key)
        if ref is None:
            ref = self._by_checkpoint[key] = ComputedReference(Path(checkpoint), image, label)
        return ref

    def _started(self, ref: ComputedReference) -> None:
        self._live.add(ref)

    def _stopped(self, ref: ComputedReference) -> None:
        self._live.discard(ref)

    def close_all(self) -> None:
        """Stop every computed reference this process started."""
        for ref in list(self._live):
            ref.close()


COMPUTED = ComputedReferences()
atexit.register(COMPUTED.close_all)
