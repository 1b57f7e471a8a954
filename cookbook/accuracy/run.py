"""Running lm-eval (`lm_eval run`) in its environment and reading what it wrote: per task, the accuracy, lm-eval's
standard error of it, and each item's right or wrong (`--log_samples`), so two runs can be compared item by item."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CookbookError
from ..image import ImageEnv, cache_dir, computed_key

REFERENCE_CACHE = "accuracy-reference-v1"
# Per task per sample: a generous ceiling on a shared 2-vCPU machine (at load average 50 a 200-sample run took 727 s).
BASE_TIMEOUT_S = 300.0
SECONDS_PER_SAMPLE = 4.0


class AccuracyError(CookbookError):
    """lm-eval did not run or wrote nothing readable."""

    exit_code = 1


@dataclass
class TaskScore:
    """One task's score in one run: accuracy, lm-eval's acc_stderr, and each item's result by doc_id."""

    task: str
    acc: float
    stderr: float
    samples: int
    correct: dict[int, bool] = field(default_factory=dict)
    questions: dict[int, str] = field(default_factory=dict)  # doc_id -> the item's prompt, shortened, for a fail

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "TaskScore":
        return TaskScore(
            task=str(data["task"]), acc=float(data["acc"]), stderr=float(data["stderr"]), samples=int(data["samples"]),
            correct={int(k): bool(v) for k, v in data.get("correct", {}).items()},
            questions={int(k): str(v) for k, v in data.get("questions", {}).items()},
        )


@dataclass
class Evaluation:
    """One lm-eval run over the tasks: the scores, and what ran it (versions, backend, seconds)."""

    scores: dict[str, TaskScore]
    backend: str
    versions: dict[str, str]
    seconds: float
    when: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "Evaluation":
        return Evaluation(
            scores={k: TaskScore.from_dict(v) for k, v in data["scores"].items()}, backend=str(data["backend"]),
            versions=dict(data.get("versions") or {}), seconds=float(data.get("seconds") or 0.0),
            when=str(data.get("when") or ""),
        )


def run_lm_eval(
    env: ImageEnv, model: str, model_args: dict[str, str], tasks: list[str], include: list[Path], limit: int,
    seed: int, versions: dict[str, str], extra: list[str] | None = None, env_vars: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> Evaluation:
    """`lm_eval run` once over `tasks` with --log_samples into a temporary folder; the scores it wrote. Secrets go in
    `env_vars` (the subprocess's environment), never on its command line, and lm-eval's output is never shown.
    `timeout_s` (from the server's measured pace) extends the per-sample ceiling, never shortens it."""
    args_text = ",".join(f"{k}={v}" for k, v in model_args.items())
    with tempfile.TemporaryDirectory(prefix="cookbook-lm-eval-") as tmp:
        out = Path(tmp) / "out"
        argv = [str(env.python), "-m", "lm_eval", "run", "--model", model, "--model_args", args_text,
                "--tasks", ",".join(tasks), "--limit", str(limit), "--seed", str(seed), "--log_samples",
                "--output_path", str(out), *(["--include_path", os.pathsep.join(map(str, include))] if include else []),
                *(extra or [])]
        run_env = env.env()
        run_env.update({"HF_DATASETS_CACHE": str(Path(tmp) / "datasets"), "TOKENIZERS_PARALLELISM": "false",
                        "HF_HUB_DISABLE_TELEMETRY": "1", **(env_vars or {})})
        timeout = max(BASE_TIMEOUT_S + SECONDS_PER_SAMPLE * limit * len(tasks), timeout_s or 0.0)
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise AccuracyError(f"lm-eval ({model}) gave no result within {timeout:.0f} s") from None
        except OSError as exc:
            raise AccuracyError(f"lm-eval: cannot start {env.python} ({exc.strerror})") from None
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise AccuracyError(f"lm-eval ({model}) exited {done.returncode}: {_last_error(done.stderr)}")
        scores = {task: read_task(out, task) for task in tasks}
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return Evaluation(scores, model, versions, round(seconds, 1), when)


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def read_task(out: Path, task: str) -> TaskScore:
    """The task's accuracy and stderr from lm-eval's results_*.json, and each item from its samples_<task>_*.jsonl."""
    results = sorted(out.rglob("results_*.json"))
    samples = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    if not results or not samples:
        raise AccuracyError(f"lm-eval wrote no results for task {task!r} under {out}")
    metrics = json.loads(results[-1].read_text()).get("results", {}).get(task) or {}
    if "acc,none" not in metrics:
        raise AccuracyError(f"lm-eval's results for {task!r} have no acc (metrics: {', '.join(metrics)[:200]})")
    correct: dict[int, bool] = {}
    questions: dict[int, str] = {}
    for line in samples[-1].read_text().splitlines():
        if not line.strip():
            continue
        sample = json.loads(line)
        doc_id = int(sample["doc_id"])
        correct[doc_id] = bool(sample.get("acc"))
        arguments = sample.get("arguments") or {}
        first = next(iter(arguments.values()), None) if isinstance(arguments, dict) else (arguments or [None])[0]
        prompt = first.get("arg_0") if isinstance(first, dict) else first[0] if isinstance(first, list) and first else ""
        questions[doc_id] = " ".join(str(prompt or sample.get("doc", "")).split())[-80:]
    stderr = metrics.get("acc_stderr,none")
    return TaskScore(task, float(metrics["acc,none"]), float(stderr) if isinstance(stderr, (int, float)) else 0.0,
                     len(correct), correct, questions)


class ReferenceScores:
    """Expected scores already computed by lm-eval's hf backend on one checkpoint, kept in the cache folder: the
    same weights, task files, sample count, seed and lm-eval version give the same answer, so a later run reads it
    instead of running the model again. Keyed like the oracle's ScoreCache (the checkpoint's file names, sizes and
    mtimes) plus each task's file hash and lm-eval's version."""

    def __init__(self, checkpoint: Path, env: ImageEnv) -> None:
        self.identity = computed_key(checkpoint, env)
        self.folder = cache_dir() / REFERENCE_CACHE

    def path(self, task_key: str, limit: int, seed: int, lm_eval_version: str) -> Path:
        key = hashlib.sha256(json.dumps([self.identity, task_key, limit, seed, lm_eval_version]).encode()).hexdigest()
        return self.folder / f"{key[:32]}.json"

    def get(self, path: Path) -> TaskScore | None:
        try:
            return TaskScore.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, path: Path, score: TaskScore, about: dict[str, Any]) -> None:
        """Written atomically; a full disk only costs the next run's time."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**asdict(score), "about": about}))
            tmp.replace(path)
        except OSError:
            return

    @staticmethod
    def about(path: Path) -> dict[str, Any]:
        try:
            return dict(json.loads(path.read_text()).get("about") or {})
        except (OSError, ValueError):
            return {}
