"""Task accuracy through lm-eval against the model's expected score (group `accuracy`, check `task-accuracy`).

lm-eval's `local-completions` backend scores the recipe's tasks on the served OpenAI API (multiple choice by
loglikelihood: `echo` with `logprobs`, so the server's prompt logprobs decide every answer). The expected score is,
for a CPU recipe, lm-eval's own `hf` backend on the same local checkpoint (fp32, CPU) computed here in the image's
environment and cached (`cookbook.accuracy.run.ReferenceScores`); for a Gaudi recipe, a score the recipe records
with its source. The served score must sit within z standard errors of the expected one, the standard error being
lm-eval's acc_stderr of the expected score: the spread a re-draw of the items would show, which a clean server's
numerics (bf16 against fp32: a few near-tie items flip either way) stay well inside, and a defect that moves the
model's answers leaves. A fail names both scores and the items that flipped (lm-eval's --log_samples, both runs).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..accuracy.env import LM_EVAL_VERSION, ensure_lm_eval_env, lm_eval_versions
from ..accuracy.run import BASE_TIMEOUT_S, Evaluation, ReferenceScores, TaskScore, run_lm_eval
from ..accuracy.tasks import CHOICES, OWN_TASKS, WrittenTask, is_own_task, write_task
from ..haystack import request_timeout
from ..image import ImageEnv, cache_dir, cache_lock, cpu_image, cpu_image_ready, system_image
from ..recipes import AccuracyExpectation
from ..reference import served_checkpoint
from ..results import Evidence
from .registry import CheckContext, CheckOutcome, CheckSkipped, check

LABEL = "Task accuracy against the reference (cookbook's own check)"
TASKS_DIR = "accuracy-tasks"
HF_BATCH_SIZE = 16
FLIPS_SHOWN = 8
REQUEST_TIMEOUT_FACTOR = 5
CHARS_PER_TOKEN = 3  # fewer than the SmolLM2 tokenizer's ~4 on English: the token estimate errs long, the deadline too


def _applies(ctx: CheckContext) -> str | None:
    if ctx.recipe is None or ctx.recipe.verification.accuracy is None:
        return "the recipe names no accuracy tasks (verification.accuracy)"
    return None


def _image(ctx: CheckContext) -> ImageEnv | None:
    """The environment lm-eval's own is built beside: the CPU image here, the container's Python on a Gaudi box."""
    if ctx.recipe is not None and ctx.recipe.image.kind == "vllm-cpu":
        return cpu_image() if cpu_image_ready() else None
    return system_image()


def _tasks(spec: AccuracyExpectation) -> tuple[list[str], list[WrittenTask]]:
    """The task names lm-eval gets, and the cookbook's own among them written into the cache (from the seed)."""
    written = [write_task(t, spec.seed, spec.samples, cache_dir() / TASKS_DIR) for t in spec.tasks if is_own_task(t)]
    return list(spec.tasks), written


def _expected(
    spec: AccuracyExpectation, ctx: CheckContext, env: ImageEnv, written: list[WrittenTask]
) -> tuple[dict[str, TaskScore], str]:
    """Per task the expected score, and the sentence that says where it came from."""
    if spec.expected == "recorded":
        scores = {t: TaskScore(t, r.acc, r.stderr, r.samples) for t, r in spec.recorded.items() if t in spec.tasks}
        sources = "; ".join(f"{t}: {r.source}" for t, r in spec.recorded.items() if t in spec.tasks)
        return scores, f"recorded in the recipe: {sources}"
    checkpoint = served_checkpoint(ctx)
    if checkpoint is None:
        raise CheckSkipped("not run: no local checkpoint to compute the expected score on (verification.accuracy.expected: computed)")
    versions = lm_eval_versions(env)
    cache = ReferenceScores(checkpoint, env)
    by_task = {w.name: w for w in written}
    paths = {t: cache.path(by_task[t].sha256 if t in by_task else t, spec.samples, spec.seed, LM_EVAL_VERSION)
             for t in spec.tasks}
    scores = {t: s for t, p in paths.items() if (s := cache.get(p)) is not None}
    missing = [t for t in spec.tasks if t not in scores]
    if missing:
        with cache_lock(f"accuracy-reference-{cache.identity[:16]}"):  # one computes, another run then reads it
            scores.update({t: s for t in missing if (s := cache.get(paths[t])) is not None})
            missing = [t for t in spec.tasks if t not in scores]
            if missing:
                _compute(ctx, spec, env, written, checkpoint, missing, cache, paths, scores)
    about = ReferenceScores.about(paths[spec.tasks[0]])
    when = about.get("when") or "now"
    source = (f"computed here: lm-eval {versions.get('lm_eval', LM_EVAL_VERSION)} hf backend (transformers "
              f"{versions.get('transformers')}, torch {versions.get('torch')}) on {checkpoint}, CPU, fp32, in the "
              f"image's environment, {when}" + ("" if missing else " (read from the cache)"))
    return scores, source


def _compute(
    ctx: CheckContext, spec: AccuracyExpectation, env: ImageEnv, written: list[WrittenTask], checkpoint: Path,
    missing: list[str], cache: ReferenceScores, paths: dict[str, Path], scores: dict[str, TaskScore],
) -> None:
    """lm-eval's hf backend on the checkpoint for the tasks not cached yet; each result cached, and into `scores`."""
    versions = lm_eval_versions(env)
    ctx.report(f"expected score: lm-eval hf on {checkpoint.name} ({', '.join(missing)})")
    computed = run_lm_eval(
        env, "hf", {"pretrained": str(checkpoint), "dtype": "float32"}, missing,
        [w.folder for w in written if w.name in missing], spec.samples, spec.seed, versions,
        extra=["--device", "cpu", "--batch_size", str(HF_BATCH_SIZE)],
        # One thread: beside a CPU server, two OpenMP threads spin against its worker (measured here: 1 to 3 against 8 requests/s).
        env_vars={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **_offline(spec)},
    )
    about = {"versions": versions, "checkpoint": str(checkpoint), "when": computed.when, "seconds": computed.seconds}
    for t in missing:
        cache.put(paths[t], computed.scores[t], about)
        scores[t] = computed.scores[t]


def _served(ctx: CheckContext, spec: AccuracyExpectation, env: ImageEnv, written: list[WrittenTask]) -> Evaluation:
    checkpoint = served_checkpoint(ctx)
    args = {
        "model": ctx.endpoint.model,
        "base_url": f"{ctx.endpoint.api_url}/completions",
        "tokenizer": str(checkpoint) if checkpoint else ctx.endpoint.model,
        "tokenizer_backend": "huggingface",
        "tokenized_requests": "True",
        "num_concurrent": str(ctx.concurrency),
        # lm-eval ends its whole run ("Session is closed") when one request runs out of retries: on a loaded CPU
        # server a request waits behind the others, so each gets several times the run's request timeout.
        "max_retries": "3",
        "timeout": str(int(ctx.request_timeout_s * REQUEST_TIMEOUT_FACTOR)),
    }
    key = ctx.endpoint.api_key
    secret = {"OPENAI_API_KEY": key} if key != "EMPTY" else {}
    ctx.report(f"lm-eval local-completions on the server ({', '.join(spec.tasks)}, {spec.samples} samples each)")
    # Prompt-logprob requests are never served from the prefix cache: every prompt is prefilled whole, so the run's
    # deadline follows the server's measured prefill pace over the prompts' size (a token per CHARS_PER_TOKEN
    # characters at most), as the probes' long requests do.
    tokens = sum(w.prompt_chars for w in written) // CHARS_PER_TOKEN
    timeout = request_timeout(BASE_TIMEOUT_S, tokens, ctx.endpoint.prefill_pace)
    return run_lm_eval(env, "local-completions", args, spec.tasks, [w.folder for w in written], spec.samples,
                       spec.seed, lm_eval_versions(env), env_vars={**secret, **_offline(spec)}, timeout_s=timeout)


def _offline(spec: AccuracyExpectation) -> dict[str, str]:
    """Only the cookbook's own tasks: nothing to fetch, so lm-eval and datasets must not try the hub."""
    if all(is_own_task(t) for t in spec.tasks):
        return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return {}


def _bound(expected: TaskScore, z: float) -> float:
    """z times lm-eval's standard error of the expected score, at least one item's worth (a perfect score has 0)."""
    return z * max(expected.stderr, 1 / max(expected.samples, 1))


def _flips(served: TaskScore, expected: TaskScore) -> tuple[list[int], list[int]]:
    """Items right in the expected run and wrong when served, and the other way round (by lm-eval's doc_id)."""
    common = sorted(set(served.correct) & set(expected.correct))
    lost = [d for d in common if expected.correct[d] and not served.correct[d]]
    gained = [d for d in common if not expected.correct[d] and served.correct[d]]
    return lost, gained


def _item(score: TaskScore, doc_id: int) -> str:
    question = score.questions.get(doc_id, "")
    return f"#{doc_id} {question!r}" if question else f"#{doc_id}"


@dataclass
class Judged:
    """The comparison of every task: what is wrong (empty: pass), the result text, evidence, per-task figures."""

    problems: list[str]
    result: str
    evidence: list[Evidence]
    per_task: dict[str, Any]


def judge(tasks: list[str], served: dict[str, TaskScore], expected: dict[str, TaskScore], z: float) -> Judged:
    """Each task's served score against its expected one: a fail when they sit more than the bound apart (or were
    scored on different sample counts), naming both scores and the items that flipped."""
    problems: list[str] = []
    parts: list[str] = []
    evidence: list[Evidence] = []
    per_task: dict[str, Any] = {}
    for task in tasks:
        got, want = served[task], expected[task]
        bound = _bound(want, z)
        diff = got.acc - want.acc
        lost, gained = _flips(got, want)
        chance = 1 / CHOICES if task in OWN_TASKS else None
        flipped = (f"{len(lost) + len(gained)} items flipped ({len(lost)} right to wrong, {len(gained)} wrong to right)"
                   if want.correct else "no per-item results in the expected score")
        parts.append(f"{task}: served {got.acc:.3f}, expected {want.acc:.3f} (bound ±{bound:.3f}, {z:g} SE), "
                     f"{flipped}, {got.samples} samples")
        if got.samples != want.samples:
            problems.append(f"{task}: served on {got.samples} samples, expected score on {want.samples}")
        if abs(diff) > bound:
            problems.append(f"{task}: served {got.acc:.3f} is {abs(diff):.3f} {'below' if diff < 0 else 'above'} the "
                            f"expected {want.acc:.3f} (bound ±{bound:.3f})")
            shown = [_item(got, d) + " now wrong" for d in lost[:FLIPS_SHOWN]]
            shown += [_item(got, d) + " now right" for d in gained[:max(0, FLIPS_SHOWN - len(shown))]]
            if shown:
                evidence.append(Evidence(note=f"{task}: flipped items: " + "; ".join(shown)))
        per_task[task] = {
            "served": round(got.acc, 5), "served_stderr": round(got.stderr, 5), "expected": round(want.acc, 5),
            "expected_stderr": round(want.stderr, 5), "bound": round(bound, 5), "z": z, "samples": got.samples,
            "chance": chance, "lost": lost, "gained": gained,
        }
    result = "; ".join(problems) + ": " + "; ".join(parts) if problems else "; ".join(parts)
    return Judged(problems, result, evidence, per_task)


@check("task-accuracy", LABEL, group="accuracy", applies=_applies)
def task_accuracy(ctx: CheckContext) -> CheckOutcome:
    assert ctx.recipe is not None and ctx.recipe.verification.accuracy is not None  # _applies
    spec = ctx.recipe.verification.accuracy
    image = _image(ctx)
    if image is None:
        raise CheckSkipped("not run: the CPU image is not built here (`cookbook setup` builds it)")
    ctx.report(f"lm-eval {LM_EVAL_VERSION} environment")
    env = ensure_lm_eval_env(image, ctx.task.progress if ctx.task else None)
    tasks, written = _tasks(spec)
    expected, source = _expected(spec, ctx, env, written)
    served = _served(ctx, spec, env, written)

    judged = judge(tasks, served.scores, expected, spec.z)
    evidence = [*judged.evidence, Evidence(note=f"expected score: {source}")]
    evidence.append(Evidence(note=f"served: lm-eval local-completions on {ctx.endpoint.api_url}, {served.seconds:.0f} s"))
    details = {"source": source, "tasks": judged.per_task, "served_seconds": served.seconds,
               "lm_eval": served.versions.get("lm_eval", LM_EVAL_VERSION), "env": str(Path(env.python).parent.parent)}
    return CheckOutcome(not judged.problems, judged.result, evidence, details)
