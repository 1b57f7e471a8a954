"""Task accuracy through lm-eval: the offline task generator, reading lm-eval's output, the judgement (bound and
flipped items), the recipe block, and, against the real CPU server, the clean recipe passing."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from cookbook.accuracy.run import AccuracyError, TaskScore, read_task
from cookbook.accuracy.tasks import CHOICES, OWN_TASKS, generate, write_task
from cookbook.checks import CHECKS, CheckContext, run_checks, selected_checks
from cookbook.checks.accuracy import LABEL, judge
from cookbook.endpoint import Endpoint
from cookbook.errors import CookbookError
from cookbook.recipes import AccuracyExpectation, Recipe, load_recipe

from servers import Registry, registry_server, uses_server

TASK = "cookbook_mc"


# -- the offline task ---------------------------------------------------------------------------------------------


def test_the_same_seed_writes_the_same_files_and_another_seed_others(tmp_path: Path) -> None:
    first = write_task(TASK, 0, 60, tmp_path / "a")
    again = write_task(TASK, 0, 60, tmp_path / "b")
    other = write_task(TASK, 1, 60, tmp_path / "c")
    assert first.sha256 == write_task(TASK, 0, 60, tmp_path / "a").sha256  # idempotent in place
    items = (first.folder / f"{TASK}.jsonl").read_text()
    assert items == (again.folder / f"{TASK}.jsonl").read_text()
    assert items != (other.folder / f"{TASK}.jsonl").read_text()
    yaml_text = (first.folder / f"{TASK}.yaml").read_text()
    assert f"task: {TASK}" in yaml_text and "output_type: multiple_choice" in yaml_text
    assert json.dumps(str(first.folder / f"{TASK}.jsonl")) in yaml_text  # the YAML reads the items beside it


def test_every_item_has_one_right_answer_among_distinct_choices() -> None:
    items = generate(0, 200)
    assert len({i.kind for i in items}) >= 8
    for item in items:
        assert len(item.choices) == CHOICES == len(set(item.choices)), item
        assert 0 <= item.answer < CHOICES
        if item.kind == "sum":
            a, b = (int(x) for x in item.question.splitlines()[-1].removesuffix(" =").split(" + "))
            assert item.choices[item.answer] == f" {a + b}"
        if item.kind == "counting":
            seq = [int(x) for x in item.question.splitlines()[-1].rstrip(",").split(", ")]
            assert int(item.choices[item.answer]) == seq[-1] + (seq[1] - seq[0])
    answers = [i.answer for i in items]
    assert all(answers.count(k) > 20 for k in range(CHOICES))  # the right answer is not always in one place


def test_an_unknown_own_task_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(CookbookError, match=r"verification\.accuracy\.tasks: 'cookbook_nope'"):
        write_task("cookbook_nope", 0, 10, tmp_path)


# -- what lm-eval wrote ----------------------------------------------------------------------------------------------


def _lm_eval_output(folder: Path, correct: list[bool], acc: float | None = None) -> Path:
    """Files in the shape lm-eval 0.4.13 writes with --log_samples (keys copied from a real run)."""
    out = folder / "out" / "model__name"
    out.mkdir(parents=True)
    acc = sum(correct) / len(correct) if acc is None else acc
    (out / "results_2026-12-02T03-06-04.json").write_text(json.dumps(
        {"results": {TASK: {"name": TASK, "alias": TASK, "sample_len": len(correct), "acc,none": acc,
                            "acc_stderr,none": 0.03}}}))
    lines = [json.dumps({"doc_id": i, "doc": {"question": f"q{i}"}, "target": 0,
                         "arguments": {"gen_args_0": {"arg_0": f"question {i},", "arg_1": " a"}},
                         "filter": "none", "metrics": ["acc"], "acc": 1.0 if ok else 0.0})
             for i, ok in enumerate(correct)]
    (out / f"samples_{TASK}_2026-12-02T03-06-04.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "out"


def test_read_task_takes_the_score_and_every_item(tmp_path: Path) -> None:
    score = read_task(_lm_eval_output(tmp_path, [True, False, True, True]), TASK)
    assert (score.acc, score.stderr, score.samples) == (0.75, 0.03, 4)
    assert score.correct == {0: True, 1: False, 2: True, 3: True}
    assert score.questions[1] == "question 1,"


def test_read_task_without_output_names_the_task(tmp_path: Path) -> None:
    with pytest.raises(AccuracyError, match=f"no results for task '{TASK}'"):
        read_task(tmp_path, TASK)


# -- the judgement ----------------------------------------------------------------------------------------------------


def _score(correct: list[bool], stderr: float = 0.03) -> TaskScore:
    return TaskScore(TASK, sum(correct) / len(correct), stderr, len(correct), dict(enumerate(correct)),
                     {i: f"item {i}" for i in range(len(correct))})


def test_a_score_within_the_bound_passes_and_counts_its_flips() -> None:
    expected = _score([True] * 80 + [False] * 20)
    served = _score([False] + [True] * 79 + [True] + [False] * 19)  # one each way: the same accuracy
    judged = judge([TASK], {TASK: served}, {TASK: expected}, z=2)
    assert not judged.problems, judged.result
    assert "served 0.800, expected 0.800 (bound ±0.060, 2 SE), 2 items flipped (1 right to wrong, 1 wrong to right)" \
        in judged.result


def test_a_drop_beyond_the_bound_fails_naming_both_scores_and_the_flipped_items() -> None:
    expected = _score([True] * 80 + [False] * 20)
    served = _score([False] * 10 + [True] * 70 + [False] * 20)
    judged = judge([TASK], {TASK: served}, {TASK: expected}, z=2)
    assert judged.problems
    assert judged.result.startswith(f"{TASK}: served 0.700 is 0.100 below the expected 0.800 (bound ±0.060)")
    assert "#0 'item 0' now wrong" in judged.evidence[0].note
    assert judged.per_task[TASK]["lost"] == list(range(10))


def test_a_different_sample_count_fails_even_at_the_same_score() -> None:
    judged = judge([TASK], {TASK: _score([True, False] * 20)}, {TASK: _score([True, False] * 25)}, z=3)
    assert any("served on 40 samples, expected score on 50" in p for p in judged.problems)


def test_a_perfect_expected_score_still_allows_no_less_than_one_item() -> None:
    judged = judge([TASK], {TASK: _score([True] * 100, 0.0)}, {TASK: _score([True] * 100, 0.0)}, z=2)
    assert not judged.problems and judged.per_task[TASK]["bound"] == 0.02


# -- the recipe block and the registry ----------------------------------------------------------------------------------


def test_a_recorded_expectation_needs_a_score_for_every_task() -> None:
    with pytest.raises(ValidationError, match="recorded has no score for 'arc_easy'"):
        AccuracyExpectation(tasks=["arc_easy"], samples=100, expected="recorded")
    with pytest.raises(ValidationError, match=r"recorded\.arc_easy\.samples is 50, samples is 100"):
        AccuracyExpectation(tasks=["arc_easy"], samples=100, expected="recorded",
                            recorded={"arc_easy": {"acc": 0.6, "stderr": 0.05, "samples": 50, "source": "x"}})


def test_the_check_is_registered_and_runs_by_default_on_the_cpu_recipe(cpu_recipe: Recipe) -> None:
    spec = CHECKS["task-accuracy"]
    assert (spec.group, spec.label) == ("accuracy", LABEL) and "cookbook's own check" in LABEL
    assert spec in selected_checks(None, cpu_recipe) and spec in selected_checks(["accuracy"], None)
    assert cpu_recipe.verification.accuracy is not None
    assert set(cpu_recipe.verification.accuracy.tasks) <= set(OWN_TASKS)  # offline here: only the cookbook's own
    assert list(CHECKS)[-1] == "server-health"


def test_a_recipe_without_tasks_does_not_apply_and_says_why(cpu_recipe: Recipe) -> None:
    recipe = load_recipe("cookbook/tiny-qwen3-next")
    assert recipe.verification.accuracy is None
    applies = CHECKS["task-accuracy"].applies
    why = applies(CheckContext(Endpoint("http://127.0.0.1:9", "m"), recipe))
    assert why is not None and "verification.accuracy" in why
    assert applies(CheckContext(Endpoint("http://127.0.0.1:9", "m"), cpu_recipe)) is None


# -- the real CPU server ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
@uses_server("accuracy")
def accuracy_server(servers: Registry) -> Iterator[Endpoint]:
    """The clean SmolLM2 recipe on a server of its own (tests/servers.py says why)."""
    for running in registry_server(servers, "accuracy"):
        yield running.endpoint


@pytest.mark.integration
def test_the_clean_cpu_server_passes_task_accuracy(accuracy_server: Endpoint, cpu_recipe: Recipe) -> None:
    started = time.monotonic()
    ctx = CheckContext(accuracy_server, cpu_recipe, request_timeout_s=120)
    result = run_checks(ctx, ["task-accuracy"]).check("task-accuracy")
    assert result is not None
    print(f"\ntask-accuracy on clean SmolLM2: {time.monotonic() - started:.1f} s: {result.result}")
    assert result.status == "pass", [result.result, *(e.note for e in result.evidence)]
    task = result.details["tasks"][TASK]
    assert task["expected"] > 2 * task["chance"]  # the task measures something: clearly above chance
    assert abs(task["served"] - task["expected"]) <= task["bound"]
    assert result.details["source"].startswith("computed here: lm-eval 0.4.13 hf backend")


def test_the_served_runs_deadline_follows_the_servers_prefill_pace(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_recipe: Recipe) -> None:
    """Every prompt is prefilled whole (prompt logprobs skip the prefix cache): on a server measured slow (an AVX2-only
    host, 170 tokens/s) the lm-eval run gets the time its ~100K prompt tokens need, never the fixed ceiling alone."""
    from cookbook.checks import accuracy as accuracy_check

    seen: dict[str, float] = {}
    monkeypatch.setattr(accuracy_check, "run_lm_eval", lambda *_a, **kw: seen.update(timeout=kw["timeout_s"]))
    monkeypatch.setattr(accuracy_check, "lm_eval_versions", lambda _env: {})
    monkeypatch.setattr(accuracy_check, "served_checkpoint", lambda _ctx: None)
    spec = cpu_recipe.verification.accuracy
    assert spec is not None
    written = [write_task(TASK, spec.seed, spec.samples, tmp_path)]
    fixed = 300 + 4 * spec.samples  # the per-sample ceiling run_lm_eval keeps as its least
    # 104K prompt tokens measured on the clean server's run (2026-12-02): at 170 tokens/s with the probes' 4x headroom
    for pace, at_least in ((None, fixed), (1 / 170, 300 + 4 * 104_000 / 170)):
        endpoint = Endpoint("http://127.0.0.1:9", cpu_recipe.served_model_name)
        endpoint.prefill_pace = pace
        accuracy_check._served(CheckContext(endpoint, cpu_recipe), spec, None, written)  # type: ignore[arg-type]
        assert seen["timeout"] > at_least, (pace, seen)
