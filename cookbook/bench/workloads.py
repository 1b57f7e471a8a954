"""The workloads: the seeds' Performance table (single stream, N streams, cold long prompts) and the concurrency
sweep, each run through the client and turned into figures as soon as it is measured."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field

from .. import haystack
from ..endpoint import Endpoint
from ..errors import CookbookError, RequestTimeout, ServerDown, ServerError
from ..progress import Progress, Task
from ..recipes import Recipe
from ..results import Hardware, RunResults, now, run_hardware
from ..roofline import roofline_rows
from .client import BatchResult, StreamRequest, StreamResult, run_batch
from .kvcache import DEFAULT_INTERVAL_S, KvSampler, attach_trace
from .measured import MEASURED_BY, MeasuredCold
from .figures import MEASURED_AS, cold_figure, n_streams_figure, single_stream_figure, sweep_figure
from .open_loop import OpenLoopConfig, open_loop_figure, run_rate_sweep
from .tables import _frame

if TYPE_CHECKING:
    import pandas as pd

SEED_LONG_FRACTIONS = (65_000 / 262_144, 131_000 / 262_144, 244_000 / 262_144)

WORKLOADS = ("single", "streams", "cold", "sweep", "rate")

TABLE = ("single", "streams", "cold")

SHORT_TOPICS = (
    "a lighthouse keeper who finds a message in a bottle", "the history of the printing press",
    "how a bridge is designed and built", "a day in the life of a honeybee", "the water cycle",
    "a journey across a desert by camel", "how bread rises", "the first flight across the Atlantic",
    "a robot learning to paint", "the life of a medieval blacksmith", "how volcanoes form",
    "a chess tournament in a small town", "the migration of whales", "how a clock works",
    "a market day in an old harbour town", "the invention of the telescope",
)




class BenchConfig(BaseModel):
    """How the workloads run; the defaults are the seeds' (256 tokens, N = --max-num-seqs, 65K/131K/244K scaled)."""

    model_config = ConfigDict(extra="forbid")

    output_tokens: int = Field(256, gt=0, description="Tokens each short-prompt stream generates (the seeds: 256)")
    streams: int | None = Field(None, gt=0, description="N of the N-stream figure; default the recipe's --max-num-seqs, else 8")
    long_lengths: list[int] | None = Field(
        None, description="Cold prompt lengths in tokens; default the recipe's needle lengths, else the seeds' scaled to the context"
    )
    long_depths: list[float] | None = Field(
        None, description="Needle depths, one cold request each per length; default the recipe's, else [0.5]"
    )
    answer_tokens: int = Field(32, gt=0, description="Tokens of the answer to a cold prompt (fixed with ignore_eos)")
    sweep_levels: list[int] | None = Field(None, description="Concurrency levels of the sweep; default 1, 2, 4, ... up to N")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of every request")
    request_timeout_s: float = Field(300.0, gt=0, description="Bound on one short-prompt request, end to end")
    cold_timeout_s: float = Field(300.0, gt=0, description="Base bound on one cold request, plus 10 ms per prompt token")
    warmup: bool = Field(True, description="A short request first, and one cold prefill before the cold figures; neither counted")
    kv_sample_interval_s: float = Field(
        DEFAULT_INTERVAL_S, ge=0, description="Seconds between reads of the server's KV-cache usage during the run; 0: not sampled"
    )
    open_loop: OpenLoopConfig = Field(default_factory=OpenLoopConfig, description="The rate workload (open loop)")


def sampling_note(temperature: float) -> str:
    """How the tokens were sampled, on every report: `vllm bench serve` 0.32 sends no temperature unless told, so
    the server samples at its default (1.0 for a model without one), which costs decode time a greedy run does not
    pay; the same work there is `--temperature 0`."""
    if temperature == 0:
        return ("greedy sampling, temperature 0; the same work in vllm bench serve 0.32 needs --temperature 0, "
                "without it the server samples at its default temperature")
    return f"sampling at temperature {temperature:g}"


def short_prompts(count: int) -> list[str]:
    """Short prompts (a dozen words), one topic per stream, the same for every run."""
    return [f"Write a long, detailed story about {SHORT_TOPICS[i % len(SHORT_TOPICS)]}." for i in range(count)]


def short_requests(count: int, output_tokens: int, timeout_s: float) -> list[StreamRequest]:
    return [StreamRequest([{"role": "user", "content": p}], output_tokens, timeout_s) for p in short_prompts(count)]


def sweep_levels(streams: int) -> list[int]:
    """1, 2, 4, ... up to `streams`, which is always the last level."""
    levels, level = [], 1
    while level < streams:
        levels.append(level)
        level *= 2
    return [*levels, streams]


def long_lengths(config: BenchConfig, recipe: Recipe | None, max_model_len: int) -> list[int]:
    """The cold-prompt lengths: asked for, else the recipe's needle lengths, else the seeds' scaled to the context;
    always capped so that prompt and answer fit."""
    if config.long_lengths:
        lengths = list(config.long_lengths)
    elif recipe is not None and recipe.verification.needles is not None and recipe.verification.needles.lengths:
        lengths = list(recipe.verification.needles.lengths)
    else:
        lengths = [int(round(max_model_len * f, -2)) for f in SEED_LONG_FRACTIONS]
    return haystack.fit_lengths(lengths, max_model_len, config.answer_tokens)


def _long_depths(config: BenchConfig, recipe: Recipe | None) -> list[float]:
    if config.long_depths:
        return list(config.long_depths)
    if recipe is not None and recipe.verification.needles is not None and recipe.verification.needles.depths:
        return list(recipe.verification.needles.depths)
    return [0.5]


def _streams(config: BenchConfig, recipe: Recipe | None) -> int:
    return config.streams or (recipe.max_num_seqs if recipe is not None else 8)


def _cold_runs(endpoint: Endpoint, length: int, depths: list[float], config: BenchConfig,
               report: Callable[[str], None] | None = None) -> list[tuple[float, StreamResult, dict[str, Any]]]:
    runs: list[tuple[float, StreamResult, dict[str, Any]]] = []
    timeout = haystack.request_timeout(config.cold_timeout_s, length)
    for number, depth in enumerate(depths, 1):
        if report:
            report(f"cold prompt {length:,} tokens, depth {depth:.0%} ({number}/{len(depths)})")
        seed = f"bench:{length}:{depth}"
        needle = haystack.make_needle(seed)
        try:
            stack = haystack.build_haystack(endpoint, length, depth, needle, seed)
        except ServerDown:
            raise
        except CookbookError as exc:  # a length this server cannot be given (shorter than the prompt frame ...)
            runs.append((depth, StreamResult(error=f"building the prompt: {exc}"), {}))
            continue
        request = StreamRequest(stack.messages, config.answer_tokens, timeout, haystack.new_salt())
        batch = run_batch(endpoint, [request], 1, config.temperature)
        result = batch.results[0]
        info = {"needle_found": needle.found_in(result.text), "asked_prompt_tokens": stack.prompt_tokens,
                "client_load_average": batch.load_average}
        runs.append((depth, result, info))
    return runs


def _short_batch(endpoint: Endpoint, streams: int, config: BenchConfig) -> BatchResult:
    return run_batch(endpoint, short_requests(streams, config.output_tokens, config.request_timeout_s), streams, config.temperature)


def _warm_up(endpoint: Endpoint, config: BenchConfig) -> None:
    run_batch(endpoint, short_requests(1, 16, config.request_timeout_s), 1, config.temperature)


def run_sweep(
    endpoint: Endpoint,
    recipe: Recipe | None = None,
    config: BenchConfig | None = None,
    progress: Progress | None = None,
    rows: list[dict[str, Any]] | None = None,
    samples: dict[str, Any] | None = None,
    span: "Callable[[str], AbstractContextManager[Any]] | None" = None,
    measured: "dict[int, tuple[str, Any]] | None" = None,
) -> "pd.DataFrame":
    """Aggregate and per-stream tokens/s and latency percentiles at 1, 2, 4, ... N streams, one row per level
    (appended to `rows` as each level ends, so that a caller keeps the levels measured if a later one fails);
    each level's per-request samples into `samples` by its stream count, each level inside `span(name)`.
    `measured`: levels another workload of the same run already ran with the same work (the single stream is level
    1, the N streams level N), by stream count as (its figure's name, its batch): those are read, not sent again,
    and their row says so in `measured_by`."""
    config = config or BenchConfig()
    levels = config.sweep_levels or sweep_levels(_streams(config, recipe))
    rows = [] if rows is None else rows
    measured = measured or {}
    task = Task(progress, "sweep", total=len(levels))
    for level in levels:
        figure, batch = measured.get(level, ("", None))
        if batch is None:
            task.step(f"{level} stream(s) x {config.output_tokens} tokens")
            with span(f"sweep@{level}") if span is not None else nullcontext():
                batch = _short_batch(endpoint, level, config)
        else:
            task.step(f"{level} stream(s): the {figure} run of this table, not sent again")
        if samples is not None:
            samples[str(level)] = {**batch.samples(), "outliers": batch.outlier_details()}
        rows.append({**batch.metrics(), "output_tokens": config.output_tokens,
                     "client_cpu_s": round(batch.client_cpu_s, 4), "other_requests_at_start": batch.other_requests_at_start,
                     "client_load_average": batch.load_average, "errors": "; ".join(batch.errors()),
                     "measured_by": figure or "sweep"})
    task.finish()
    return _frame(rows)


def _hardware(endpoint: Endpoint, recipe: Recipe | None, hardware: Hardware | None) -> Hardware:
    return run_hardware(hardware, recipe, endpoint.base_url)


def run_performance_table(
    endpoint: Endpoint,
    recipe: Recipe | None = None,
    config: BenchConfig | None = None,
    hardware: Hardware | None = None,
    workloads: Iterable[str] = TABLE,
    progress: Progress | None = None,
    measured_cold: MeasuredCold | None = None,
) -> RunResults:
    """The seeds' Performance table (single stream, N streams, cold long prompts), optionally the sweep, as
    RunResults; decode figures carry their roofline row when the recipe and the hardware are known.
    `measured_cold`: cold requests this run already sent to this server (`bench.measured.needle_cold_runs`): a
    length they cover is read from them, not sent again."""
    config = config or BenchConfig()
    wanted = list(dict.fromkeys(workloads))
    unknown = [w for w in wanted if w not in WORKLOADS]
    if unknown:
        raise CookbookError(f"--workloads: unknown workload {unknown[0]!r} (known: table, {', '.join(WORKLOADS)})")
    hardware = _hardware(endpoint, recipe, hardware)
    task = Task(progress, "bench")  # a step per workload; the sweep reports its levels as a task of its own
    results = RunResults(
        recipe=recipe.id if recipe else "(none)",
        model=endpoint.model,
        hardware=hardware,
        image=recipe.image.label.replace("`", "") if recipe else "",
        performance_note=f"Single runs on the server above, {hardware.description} (measured as: {MEASURED_AS}; "
                         f"{sampling_note(config.temperature)}).",
        started_at=now(),
    )
    try:
        results.kv_pool_tokens = endpoint.kv_pool_tokens()
    except (ServerError, OSError):
        pass
    step = {"name": "warm-up"}
    sampler = KvSampler(endpoint, config.kv_sample_interval_s).start() if config.kv_sample_interval_s > 0 else None
    try:
        _run_workloads(endpoint, recipe, config, hardware, wanted, results, task, step, progress, sampler, measured_cold)
    except ServerError as exc:  # the server died, stalled or the budget ran out: keep every figure measured so far
        results.stopped = f"stopped during {step['name']}: {exc}"
        task.update(f"{results.stopped}; the figures measured before it are kept")
    finally:
        if sampler is not None:
            attach_trace(results, sampler.stop())
    task.finish()
    if recipe is not None:
        _attach_roofline(results, recipe)
    results.finished_at = now()
    return results


def _run_workloads(endpoint: Endpoint, recipe: Recipe | None, config: BenchConfig, hardware: Hardware, wanted: list[str],
                   results: RunResults, task: Task, step: dict[str, str], progress: Progress | None = None,
                   sampler: KvSampler | None = None, measured_cold: MeasuredCold | None = None) -> None:
    """The workloads in order, each figure appended as soon as it is measured; `step` names the one running,
    `task` shows it (each cold prompt's runs as its detail), and the KV sampler (if any) records a span per workload
    (a warm-up's span goes with the figure after it)."""

    def span(name: str, figure: str | None = None) -> AbstractContextManager[Any]:
        return sampler.span(name, figure) if sampler is not None else nullcontext()

    def begin(name: str) -> None:
        step["name"] = name
        budget = endpoint.budget
        if budget is not None and budget.expired:
            raise RequestTimeout(f"{budget.describe()} was used up")

    say = task.step
    streams = _streams(config, recipe)
    measured: dict[int, tuple[str, Any]] = {}  # stream count -> (figure, batch): the sweep reads what these ran
    begin("warm-up")
    if config.warmup and any(w != "cold" for w in wanted):
        say("warm-up: one short request (not counted)")
        with span("warm-up"):
            _warm_up(endpoint, config)
    if "single" in wanted:
        begin("single-stream")
        say(f"single-stream: 1 stream x {config.output_tokens} tokens")
        with span("single-stream", "single-stream"):
            batch = _short_batch(endpoint, 1, config)
        results.performance.append(single_stream_figure(batch, config.output_tokens, hardware))
        measured[1] = ("single-stream", batch)
    if "streams" in wanted:
        begin("n-streams")
        say(f"n-streams: {streams} streams x {config.output_tokens} tokens")
        with span("n-streams", "n-streams"):
            batch = _short_batch(endpoint, streams, config)
        results.performance.append(n_streams_figure(batch, config.output_tokens, hardware))
        measured[streams] = ("n-streams", batch)
    if "cold" in wanted:
        begin("cold prompts")
        lengths = long_lengths(config, recipe, haystack.server_max_model_len(endpoint))
        depths = _long_depths(config, recipe)
        asked_depths = list(config.long_depths) if config.long_depths else None
        reused = {n: (measured_cold.for_length(n, asked_depths) if measured_cold else None) for n in lengths}
        to_send = [n for n in lengths if reused[n] is None]
        warmup_s: float | None = None
        if config.warmup and to_send:
            say(f"warm-up: one cold prefill of {to_send[0]:,} tokens (not counted)")
            with span("cold warm-up"):
                warm = _cold_runs(endpoint, to_send[0], [depths[0]], config.model_copy(update={"answer_tokens": 1}))
            warmup_s = warm[0][1].e2e_s
        for length in lengths:
            begin(f"cold-prompt-{haystack.format_tokens(length)}")
            name = f"cold-prompt-{haystack.format_tokens(length)}"
            runs = reused[length]
            if runs is not None:
                say(f"cold prompts: {length:,} tokens, the {len(runs)} request(s) of {MEASURED_BY} (not sent again)")
                results.performance.append(cold_figure(length, runs, config.answer_tokens, hardware, None, MEASURED_BY))
                continue
            say(f"cold prompts: {length:,} tokens at {len(depths)} depth(s)")
            with span(name, name):
                runs = _cold_runs(endpoint, length, depths, config, task.update)
            results.performance.append(cold_figure(length, runs, config.answer_tokens, hardware, warmup_s))
            warmup_s = None
    if "sweep" in wanted:
        begin("sweep")
        rows: list[dict[str, Any]] = []
        samples: dict[str, Any] = {}
        try:
            run_sweep(endpoint, recipe, config, progress, rows, samples, lambda level: span(level, "sweep"), measured)
        finally:  # the levels measured before a failure are kept
            if rows:
                results.performance.append(sweep_figure(_frame(rows), hardware, samples))
    if "rate" in wanted:
        begin("open loop")
        rate_rows: list[dict[str, Any]] = []
        rate_samples: dict[str, Any] = {}
        max_len = haystack.server_max_model_len(endpoint) if config.open_loop.dataset.name == "sharegpt" else None
        try:
            with span("open-loop", "open-loop"):
                run_rate_sweep(endpoint, config.open_loop, config.temperature, config.request_timeout_s, progress,
                               rate_rows, rate_samples, max_len, lambda text: len(endpoint.tokenize(text)))
        finally:  # the rates measured before a failure are kept
            if rate_rows:
                results.performance.append(open_loop_figure(rate_rows, config.open_loop, hardware, MEASURED_AS,
                                                            rate_samples))


def _attach_roofline(results: RunResults, recipe: Recipe) -> None:
    """MBU into each decode figure's metrics, the whole row into its details (sweep rows get an mbu column)."""
    rows = {row.figure: row for row in roofline_rows(recipe, results.performance, results.hardware)}
    for figure in results.performance:
        row = rows.get(figure.name)
        if row is not None:
            figure.metrics["mbu"] = round(row.mbu, 5)
            figure.metrics["roofline_bound_tokens_per_s"] = round(row.bound_tokens_per_s, 1)
            figure.details["roofline"] = row.model_dump()
        if figure.name == "sweep":
            for level in figure.details.get("rows", []):
                sweep_row = rows.get(f"sweep@{level['streams']}")
                level["mbu"] = round(sweep_row.mbu, 5) if sweep_row else None
