"""cookbook.plots: the one module that draws. Each figure from small synthetic data (titles, axes and series, not
pixels), the needle heatmap against the details the check returns, the check that never draws, what `cookbook
verify` saves, and an import scan that keeps matplotlib out of every other module."""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from cookbook import compare, plots
from cookbook.checks import CHECKS, CheckContext
from cookbook.checks import needles as needles_check
from cookbook.checks.needles import NeedleCell, NeedleGrid
from cookbook.cli import main
from cookbook.endpoint import Endpoint
from cookbook.haystack import ServedModel
from cookbook.launch import free_port
from cookbook.recipes import load_recipe
from cookbook.results import CheckResult, Figure, Hardware, RunResults, read_results
from cookbook.roofline import hardware_facts, roofline_rows

PACKAGE = Path(__file__).resolve().parent.parent / "cookbook"
NOTEBOOKS = PACKAGE.parent / "notebooks"
MAY_IMPORT_MATPLOTLIB = {"plots.py"}  # ui.py draws nothing: its panels show tables
CPU = Hardware(kind="cpu", description="2 vCPU test box")
PNG = b"\x89PNG\r\n\x1a\n"


# -- only plots imports matplotlib ---------------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import that can run: those under `if TYPE_CHECKING:` only annotate, they load nothing."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def matplotlib_importers() -> dict[str, list[int]]:
    """Module path (relative to cookbook/) -> lines that import matplotlib at run time."""
    importers: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        lines = [line for line, module in _runtime_imports(tree) if module.split(".")[0] == "matplotlib"]
        if lines:
            importers[path.relative_to(PACKAGE).as_posix()] = lines
    return importers


def test_only_plots_imports_matplotlib() -> None:
    importers = matplotlib_importers()
    assert "plots.py" in importers  # the scan sees imports inside functions (plots imports lazily)
    others = {name: lines for name, lines in importers.items() if name not in MAY_IMPORT_MATPLOTLIB}
    assert others == {}, f"only cookbook/plots.py draws; these modules import matplotlib: {others}"


def test_the_scan_catches_a_lazy_import_and_skips_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from matplotlib.figure import Figure\n"
        "def draw():\n    import matplotlib.pyplot as plt\n    from matplotlib.figure import Figure\n"
    )
    assert [m for _, m in _runtime_imports(ast.parse(source))] == ["typing", "matplotlib.pyplot", "matplotlib.figure"]


def test_the_needle_plot_module_is_gone() -> None:
    assert not (PACKAGE / "needle_plot.py").exists()


def test_notebooks_draw_through_plots() -> None:
    """Every figure a notebook shows is drawn by a `plots` function that exists (the notebooks run only in the
    integration suite, so a renamed function would otherwise go unseen here)."""
    sources = {p.stem: p.read_text() for p in sorted(NOTEBOOKS.glob("*.ipynb"))}
    called = {name for text in sources.values() for name in re.findall(r"\bplots\.(\w+)\(", text)}
    assert {"checks_figure", "prefix_cache_figure", "needles_figure", "engine_states_figure", "throughput_figure",
            "latency_figure", "roofline_figure"} <= called
    assert [name for name in sorted(called) if not callable(getattr(plots, name, None))] == []
    drawers = {stem: set(re.findall(r"\b(\w+)\.\w+_figure\(", text)) - {"plots", "session"} for stem, text in sources.items()}
    assert {stem: found for stem, found in drawers.items() if found} == {}  # session.show_figure only saves


# -- bench figures ---------------------------------------------------------------------------------------------


def sweep() -> pd.DataFrame:
    rows = []
    for streams, aggregate, failed in ((1, 45.0, 0), (2, 88.0, 0), (4, 160.0, 1)):
        row = {"streams": streams, "aggregate_tokens_per_s": aggregate, "per_stream_tokens_per_s": aggregate / streams,
               "failed": failed}
        for i, stat in enumerate(("p50", "p90", "p99")):
            row.update({f"ttft_ms_{stat}": 50.0 * streams + i, f"tpot_ms_{stat}": 20.0 + i, f"itl_ms_{stat}": 19.0 + i})
        rows.append(row)
    return pd.DataFrame(rows)


def test_throughput_figure() -> None:
    figure = plots.throughput_figure(sweep(), "SmolLM2 on a CPU")
    left, right = figure.axes
    assert left.get_title() == "SmolLM2 on a CPU"
    assert left.get_xlabel() == "concurrent streams" and left.get_ylabel() == "aggregate tokens/s"
    assert list(left.lines[0].get_ydata()) == [45.0, 88.0, 160.0] and list(left.lines[0].get_xdata()) == [1, 2, 4]
    assert list(right.lines[0].get_ydata()) == [45.0, 44.0, 40.0]
    assert [t.get_text() for t in left.texts] == ["1 failed"]
    assert plots.throughput_figure(sweep()).axes[0].get_title() == "Throughput against concurrency"


def test_latency_figure() -> None:
    figure = plots.latency_figure(sweep(), "SmolLM2 on a CPU")
    first, second = figure.axes
    assert figure.get_suptitle() == "SmolLM2 on a CPU"
    assert [line.get_label() for line in first.lines] == ["TTFT p50", "TTFT p90", "TTFT p99"]
    assert len(second.lines) == 6 and second.get_ylabel() == "ms per output token"
    assert list(first.lines[2].get_ydata()) == [52.0, 102.0, 202.0]


def test_roofline_figure_from_published_figures() -> None:
    recipe = load_recipe("Qwen/Qwen3-Coder-Next")
    published = read_results(recipe.folder / "results.json")
    rows = roofline_rows(recipe, published.performance, published.hardware)
    assert rows
    axes = plots.roofline_figure(rows, recipe, hardware_facts(published.hardware, recipe)).axes[0]
    labels = [line.get_label() for line in axes.lines]
    assert labels == ["bandwidth bound (routed experts)", "if every expert were read each step", "measured"]
    assert sorted(axes.lines[2].get_xdata()) == sorted(r.batch for r in rows)
    assert axes.get_yscale() == "log" and recipe.model.id in axes.get_title()
    assert any(t.get_text().startswith("MBU ") for t in axes.texts)
    empty = plots.roofline_figure([], recipe).axes[0]
    assert len(empty.lines) == 0 and "no roofline" in empty.texts[0].get_text()


# -- verify figures: drawn from the checks' details ------------------------------------------------------------


def run(*checks: CheckResult) -> RunResults:
    return RunResults(recipe="HuggingFaceTB/SmolLM2-135M-Instruct", model="m", hardware=CPU, checks=list(checks))


def colour(patch: object) -> tuple[float, ...]:
    return tuple(round(x, 3) for x in patch.get_facecolor()[:3])  # type: ignore[attr-defined]


def rgb(hex_colour: str) -> tuple[float, ...]:
    return tuple(round(int(hex_colour[i:i + 2], 16) / 255, 3) for i in (1, 3, 5))


def test_checks_figure_times_each_check_in_its_status_colour() -> None:
    results = run(CheckResult(name="known-answer", label="k", status="pass", result="8/8", duration_s=1.5),
                  CheckResult(name="tool-call-auto", label="t", status="known limitation", result="0/5", duration_s=0.5),
                  CheckResult(name="seed", label="s", status="fail", result="differs", duration_s=2.0))
    axes = plots.checks_figure(results).axes[0]
    assert len(axes.patches) == 3
    assert [t.get_text() for t in axes.get_yticklabels()] == ["seed", "tool-call-auto", "known-answer"]  # top down
    assert [p.get_width() for p in axes.patches] == [2.0, 0.5, 1.5]
    assert [colour(p) for p in axes.patches] == [rgb("#c62828"), rgb("#f9a825"), rgb("#2e7d32")]
    assert axes.get_xlabel() == "seconds" and "2 vCPU test box" in axes.get_title()


def prefix_check() -> CheckResult:
    def prompt(tokens: int, cached: list[int | None], diff: float | None, same: bool) -> dict[str, object]:
        return {"target_tokens": tokens, "prompt_tokens": tokens, "cached_tokens": cached, "seconds": [1.0, 0.2],
                "comparison": {"text_identical": same, "bit_identical": same, "max_logprob_diff": diff}, "problems": []}

    return CheckResult(name="prefix-cache", label="Prefix cache", status="fail", result="1 of 2 differs",
                       details={"max_logprob_diff_allowed": 0.05,
                                "prompts": [prompt(300, [0, 288], 0.01, True), prompt(1500, [0, None], 0.3, False)]})


def test_prefix_cache_figure() -> None:
    figure = plots.prefix_cache_figure(prefix_check())
    left, right = figure.axes
    assert [p.get_height() for p in left.patches] == [300, 1500, 288, 0]  # prompt tokens, then cached on the hit
    assert [p.get_height() for p in right.patches] == [0.01, 0.3]
    assert [colour(p) for p in right.patches] == [rgb("#2e7d32"), rgb("#c62828")]
    assert right.lines[0].get_ydata()[0] == 0.05  # the allowance
    assert figure.get_suptitle() == "Prefix-cache hit vs cold: fail: 1 of 2 differs"
    empty = plots.prefix_cache_figure(None)
    assert empty.get_suptitle().endswith("not run") and empty.axes[0].texts[0].get_text() == "no prompts in these results"


def cell(length: int, depth: float, found: bool, seconds: float) -> NeedleCell:
    return NeedleCell(target_tokens=length, prompt_tokens=length + 7, depth=depth, actual_depth=depth,
                      needle_key="the blue door", needle_value="4829173", answer="4829173" if found else "no idea",
                      found=found, seconds=seconds, cached_tokens=0)


def test_the_needle_check_returns_data_and_draws_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check with its requests stubbed: its details hold the grid, no PNG is written, and the heatmap drawn from
    the details shows each cell as the details say."""

    def probe(_endpoint: object, lengths: list[int], depths: list[float], **_kw: object) -> tuple[NeedleGrid, list[object]]:
        cells = [cell(n, d, found=(n, d) != (3000, 0.5), seconds=1.0 + i) for i, (n, d) in
                 enumerate((n, d) for n in lengths for d in depths)]
        return NeedleGrid(lengths=lengths, depths=depths, cells=cells), []

    monkeypatch.setattr(needles_check, "served_model", lambda _endpoint: ServedModel(max_model_len=8192))
    monkeypatch.setattr(needles_check, "probe_needles", probe)
    ctx = CheckContext(Endpoint("http://127.0.0.1:9", "m"), None, out_dir=tmp_path,
                       params={"needle_lengths": [1000, 3000], "needle_depths": [0.1, 0.5, 0.9]})
    outcome = CHECKS["needles"].fn(ctx)
    assert list(tmp_path.iterdir()) == [] and "figure" not in outcome.details  # the check never draws
    check = CheckResult(name="needles", label=outcome.label or "", status="fail", result=outcome.result,
                        details=json.loads(json.dumps(outcome.details)))  # as read back from a results file
    axes = plots.needles_figure(check).axes[0]
    grid = NeedleGrid.model_validate(check.details)
    image = axes.images[0].get_array()
    texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in axes.texts}
    for c in check.details["cells"]:
        col, row = grid.lengths.index(c["target_tokens"]), grid.depths.index(c["depth"])
        assert image[row][col] == (plots.NEEDLE_FOUND if c["found"] else plots.NEEDLE_MISSED)
        assert texts[(col, row)] == f"{'found' if c['found'] else 'missed'}\n{c['seconds']:.1f} s"
    assert [t.get_text() for t in axes.get_xticklabels()] == ["1K", "3K"]  # the prompts as the server counted them
    assert [t.get_text() for t in axes.get_yticklabels()] == ["10%", "50%", "90%"]
    assert axes.get_title() == f"{plots.NEEDLE_TITLE}: 5/6 found"
    assert plots.save(plots.needles_figure(check), tmp_path / "figs" / "needles.png").read_bytes()[:8] == PNG


def test_a_miss_the_reference_makes_too_is_an_amber_model_limit_not_a_red_miss() -> None:
    limit = cell(4000, 0.5, False, 3.0).model_copy(update={"model_limit": True, "judged_by": "the reference"})
    grid = NeedleGrid(lengths=[2000, 4000], depths=[0.5], cells=[cell(2000, 0.5, True, 1.0), limit])
    check = CheckResult(name="needles", label="n", status="pass", result="2/2", details=grid.model_dump())
    axes = plots.needles_figure(check).axes[0]
    assert list(axes.images[0].get_array()[0]) == [plots.NEEDLE_FOUND, plots.NEEDLE_MODEL_LIMIT]
    assert [t.get_text() for t in axes.texts] == ["found\n1.0 s", "model limit\n3.0 s"]
    assert axes.get_title() == f"{plots.NEEDLE_TITLE}: 1/2 found (1 a model limit)"
    from cookbook import report

    assert list(report.needles_frame(check).iloc[0]) == ["found 1.0 s", "model limit 3.0 s"]


def test_a_needle_cell_that_did_not_run_and_a_grid_that_did_not() -> None:
    partial = NeedleGrid(lengths=[1000, 2000], depths=[0.5], cells=[cell(1000, 0.5, True, 1.2)])
    axes = plots.needles_figure(CheckResult(name="needles", label="n", status="fail", result="1/1",
                                            details=partial.model_dump())).axes[0]
    assert list(axes.images[0].get_array()[0]) == [plots.NEEDLE_FOUND, plots.NEEDLE_NOT_RUN]
    assert [t.get_text() for t in axes.texts] == ["found\n1.2 s", "not run"]
    skipped = CheckResult(name="needles", label="n", status="skipped", result="skipped: random weights")
    assert plots.needles_figure(skipped).axes[0].texts[0].get_text() == "needles: skipped: random weights"
    assert plots.needles_figure(None).axes[0].texts[0].get_text() == "needles: not run"


def engine_states() -> list[CheckResult]:
    def compared(name: str, identical: bool, diff: float | None, verdict: str | None) -> dict[str, object]:
        return {"name": name, "tokens_identical": identical, "max_logprob_diff": diff,
                "departure": {"position": 3, "verdict": verdict, "baseline_margin": 0.01} if verdict else None}

    return [
        CheckResult(name="batch-composition", label="Batch composition", status="fail", result="1 of 3 diverged",
                    details={"tolerances": {"runs_drift": {"value": 0.05}},
                             "comparisons": [compared("a", True, 0.0, None), compared("b", False, 0.02, "tie"),
                                             compared("c", False, 1.5, "fail")]}),
        CheckResult(name="preemption", label="Preemption", status="inconclusive", result="no preemption", details={}),
    ]


def test_engine_states_figure_colours_each_request_by_its_verdict() -> None:
    figure = plots.engine_states_figure(run(*engine_states()))
    bars, empty = figure.axes[0], figure.axes[1]
    assert [p.get_height() for p in bars.patches] == [0.0, 0.02, 1.5]
    assert [plots.VERDICT_COLOURS.get(v, "#c62828") for v in ("identical", "tie", "fail")] == [
        "#2e7d32", "#f9a825", "#c62828"]
    assert [tuple(round(x, 3) for x in p.get_facecolor()[:3]) for p in bars.patches][2] == (0.776, 0.157, 0.157)
    assert bars.get_title() == "batch-composition: fail" and empty.get_title() == "preemption: inconclusive"
    assert bars.lines and bars.lines[0].get_ydata()[0] == 0.05  # the recipe's allowance


def test_check_figures_are_the_ones_the_results_have_data_for(tmp_path: Path) -> None:
    known = CheckResult(name="known-answer", label="k", status="pass", result="8/8", duration_s=1.0)
    needles = CheckResult(name="needles", label="n", status="skipped", result="skipped: random weights")
    assert plots.check_figures(run()) == {}
    assert set(plots.check_figures(run(known))) == {"verify"}
    figures = plots.check_figures(run(known, prefix_check(), needles, *engine_states()))
    assert list(figures) == ["verify", "needles", "prefix_cache", "engine_states"]
    assert [a.get_title() for a in figures["engine_states"].axes] == ["batch-composition: fail", "preemption: inconclusive"]
    assert len(figures["verify"].axes[0].patches) == 5
    paths = plots.save_check_figures(run(known, needles), tmp_path / "out")
    assert paths == {"verify": tmp_path / "out" / "verify.png", "needles": tmp_path / "out" / "needles.png"}
    assert all(p.read_bytes()[:8] == PNG for p in paths.values())


def test_verify_saves_the_check_figures_beside_its_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a server that is down: every check 'not run' (no check is called), and still the figures that say so,
    named in the results' artifacts relative to the results file."""
    for name, spec in list(CHECKS.items()):
        monkeypatch.setitem(CHECKS, name, dataclasses.replace(spec, fn=lambda ctx: pytest.fail("a check ran")))
    out = tmp_path / "run" / "verify.json"
    code = main(["verify", "--base-url", f"http://127.0.0.1:{free_port()}", "--recipe", "HuggingFaceTB/SmolLM2-135M-Instruct",
                 "--checks", "known-answer,needles,prefix-cache", "--json", str(out), "--out-dir", str(tmp_path / "figs")])
    assert code == 1
    results = read_results(out)
    assert {c.status for c in results.checks} == {"not run"}
    assert results.artifacts == {name: f"../figs/{name}.png" for name in ("verify", "needles", "prefix_cache")}
    for relative in results.artifacts.values():
        assert (out.parent / relative).read_bytes()[:8] == PNG


# -- two runs compared -----------------------------------------------------------------------------------------


def bench_run(tokens_per_s: float, ttft_s: float, hardware: str = "cpu") -> RunResults:
    return RunResults(recipe="r", model="m", hardware=Hardware(kind=hardware, description=hardware), performance=[
        Figure(name="single-stream", label="One stream", result="x", metrics={"tokens_per_s": tokens_per_s, "ttft_s": ttft_s}),
    ])


def test_comparison_figure_has_a_bar_per_delta_coloured_by_verdict() -> None:
    result = compare.compare_runs(bench_run(20.0, 0.10), bench_run(25.0, 0.30))
    axes = plots.comparison_figure(result).axes[0]
    assert len(axes.containers[0]) == len(result.deltas) == 2
    bars = list(axes.containers[0])
    assert [p.get_width() for p in bars] == pytest.approx([25.0, 200.0])
    assert [colour(p) for p in bars] == [rgb("#2e7d32"), rgb("#c62828")]  # faster: better; 3x TTFT: regression
    assert axes.get_title() == "A: cpu (measured)\nB: cpu (measured)"
    same = plots.comparison_figure(compare.compare_runs(bench_run(20.0, 0.1), RunResults(recipe="r", model="m", hardware=CPU)))
    assert same.axes[0].texts[0].get_text() == "no performance figure in common"


def test_figure_path_and_save(tmp_path: Path) -> None:
    assert plots.figure_path(Path("out/cmp")) == Path("out/cmp.png")
    assert plots.figure_path(Path("out/cmp.SVG")) == Path("out/cmp.SVG")
    assert plots.figure_path(Path("out/cmp.v2")) == Path("out/cmp.v2.png")
    figure = plots.comparison_figure(compare.compare_runs(bench_run(20.0, 0.1), bench_run(21.0, 0.1)))
    assert plots.save(figure, tmp_path / "a" / "b.png").read_bytes()[:8] == PNG
    assert plots.save(figure, tmp_path / "a" / "b.svg").read_text().lstrip().startswith("<?xml")


# -- per-request, over-the-run and trend figures ---------------------------------------------------------------


def bench_results(stall: bool = True) -> RunResults:
    """Single stream, 4 streams (one stalled 1.5 s at its 10th token when `stall`), a 2-level sweep, two cold
    lengths (one request failed), and a KV trace: synthetic, as the bench writes them."""
    from cookbook.bench import BatchResult, StreamResult, cold_figure, n_streams_figure, single_stream_figure, sweep_figure
    from cookbook.bench.kvcache import KvSpan, KvTrace, attach_trace

    def batch(streams: int, stalled: bool = False) -> BatchResult:
        results = []
        for i in range(streams):
            gaps = [0.020 + 0.001 * (j % 3) for j in range(31)]
            if stalled and i == 1:
                gaps[10] = 1.5
            results.append(StreamResult(ok=True, output_tokens=32, ttft_s=0.05 + 0.001 * i, e2e_s=0.05 + sum(gaps), itl_s=gaps))
        return BatchResult(streams, results, wall_s=max(r.e2e_s or 0 for r in results))

    sweep_rows, samples = [], {}
    for level in (1, 2):
        level_batch = batch(level)
        sweep_rows.append({**level_batch.metrics(), "output_tokens": 32})
        samples[str(level)] = level_batch.samples()
    cold = [(0.5, StreamResult(ok=True, ttft_s=0.4, e2e_s=0.9, output_tokens=32, prompt_tokens=1000), {}),
            (0.5, StreamResult(ok=False, error="boom"), {})]
    results = RunResults(recipe="r", model="m", hardware=CPU, kv_pool_tokens=40_000, performance=[
        single_stream_figure(batch(1), 32, CPU), n_streams_figure(batch(4, stall), 32, CPU),
        cold_figure(1000, cold, 32, CPU, 3.0),
        cold_figure(3000, [(0.5, StreamResult(ok=True, ttft_s=1.2, e2e_s=1.7, output_tokens=32, prompt_tokens=3000), {})], 32, CPU, None),
        sweep_figure(pd.DataFrame(sweep_rows), CPU, samples)])
    trace = KvTrace(metric="vllm:kv_cache_usage_perc", samples=[(t / 2, t / 200) for t in range(24)], spans=[
        KvSpan(name="warm-up", start_s=0, end_s=1), KvSpan(name="single-stream", start_s=1, end_s=4, figure="single-stream"),
        KvSpan(name="n-streams", start_s=4, end_s=8, figure="n-streams"), KvSpan(name="sweep@1", start_s=8, end_s=10, figure="sweep"),
        KvSpan(name="sweep@2", start_s=10, end_s=12, figure="sweep")])
    attach_trace(results, trace)
    return results


def _red_points(axes: object) -> list[float]:
    """y of every red (outlier) scatter point of a panel."""
    from matplotlib.colors import to_hex

    found = []
    for collection in axes.collections:  # type: ignore[attr-defined]
        colours = {to_hex(c) for c in collection.get_facecolors()}
        if colours == {plots.OUTLIER_COLOUR}:
            found.extend(float(y) for _, y in collection.get_offsets())
    return found


def test_the_latency_distribution_marks_and_counts_a_planted_stall() -> None:
    figure = plots.latency_distribution_figure(bench_results())
    ttft, itl = figure.axes
    assert itl.get_title() == "ITL: 1 outlier" and _red_points(itl) == [1500.0]
    assert ttft.get_title() == "TTFT: 0 outliers" and _red_points(ttft) == []
    assert [t.get_text() for t in itl.get_xticklabels()] == ["single\nstream", "4 streams", "sweep\n1 stream", "sweep\n2 streams"]
    notes = [t.get_text() for t in itl.texts]
    assert "n=124\n1 outlier" in notes and "n=31\n0 outliers" in notes  # 4 x 31 gaps, the stall among them
    assert any("Q3 + 3 x IQR" in text.get_text() for text in figure.legends[0].get_texts())
    calm = bench_results(stall=False)
    drawn = plots.latency_distribution_figure(calm)
    assert drawn.axes[1].get_title() == "ITL: 0 outliers" and _red_points(drawn.axes[1]) == []
    calm.performance[0].details["samples"]["itl_ms"][0][:2] = [0.0, 0.0]  # two tokens read in one socket read
    assert plots.latency_distribution_figure(calm).axes[1].get_title() == (
        "ITL: 0 outliers; 2 gaps of 0 ms (tokens read together) below the log axis")


def test_throughput_latency_curve_labels_each_point_with_its_streams() -> None:
    figure = plots.throughput_latency_figure(sweep(), "SmolLM2 on a CPU")
    ttft, itl = figure.axes
    p50 = ttft.lines[0]
    assert list(p50.get_xdata()) == [50.0, 100.0, 200.0] and list(p50.get_ydata()) == [45.0, 88.0, 160.0]
    assert [t.get_text() for t in ttft.texts] == ["1", "2", "4", "1", "2", "4"]
    assert list(itl.lines[1].get_xdata()) == [21.0, 21.0, 21.0] and "streams" in itl.get_xlabel()


def test_ttft_against_prompt_length_from_the_cold_figures() -> None:
    axes = plots.ttft_prompt_length_figure(bench_results()).axes[0]
    by_label = {line.get_label(): line for line in axes.lines}
    cold = by_label["cold prompt (fresh cache_salt)"]
    assert list(cold.get_xdata()) == [1000, 3000] and list(cold.get_ydata()) == [0.4, 1.2]
    assert list(by_label["warm-up: first cold prefill (not counted)"].get_ydata()) == [3.0]
    assert "1 failed request(s)" in by_label and "prompt tokens/s" in " ".join(by_label)
    empty = plots.ttft_prompt_length_figure(RunResults(recipe="r", model="m", hardware=CPU)).axes[0]
    assert [t.get_text() for t in empty.texts] == ["no cold prompts in these results"]


def test_kv_cache_figure_plots_the_trace_with_workloads_shaded() -> None:
    axes = plots.kv_cache_figure(bench_results()).axes[0]
    line = axes.lines[0]
    assert list(line.get_xdata())[:3] == [0.0, 0.5, 1.0] and max(line.get_ydata()) == pytest.approx(11.5)
    labels = [t.get_text() for t in axes.texts]
    assert labels[:5] == ["warm-up", "single-stream", "n-streams", "sweep@1", "sweep@2"] and "peak 11.5 %" in labels
    assert "vllm:kv_cache_usage_perc" in axes.get_ylabel() and "pool 40,000 tokens" in axes.get_title()
    results = bench_results()
    for figure in results.performance:
        if "kv_cache" in figure.details:
            figure.details["kv_cache"].update(metric=None, samples=[], note="not exposed: the server's /metrics has neither")
    axes = plots.kv_cache_figure(results).axes[0]
    assert "not exposed" in [t.get_text() for t in axes.texts][-1] and "not exposed" in axes.get_ylabel()


def test_save_run_plots_writes_the_new_figures(tmp_path: Path) -> None:
    paths = plots.save_run_plots(bench_results(), None, tmp_path)
    assert set(paths) == {"throughput", "latency", "latency_distribution", "throughput_latency", "ttft_prompt_length", "kv_cache"}
    assert all(path.read_bytes()[:8] == PNG for path in paths.values())
    assert plots.bench_figures(RunResults(recipe="r", model="m", hardware=CPU)) == {}


def test_trend_figure_marks_each_regression() -> None:
    runs = []
    for rate in (100.0, 110.0, 80.0, 81.0):
        runs.append(RunResults(recipe="r", model="m", hardware=CPU, performance=[
            Figure(name="single-stream", label="One stream", result="x", metrics={"tokens_per_s": rate})]))
    trend = compare.trend_runs(runs, ["runs/a", "runs/b", "runs/c", "runs/d"], 0.05)
    axes = plots.trend_figure(trend).axes[0]
    crosses = [line for line in axes.lines if line.get_marker() == "X"]
    assert [(list(c.get_xdata()), list(c.get_ydata())) for c in crosses] == [([2], [80.0])]
    assert [t.get_text() for t in axes.texts] == ["-27%"]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["1. a", "2. b", "3. c", "4. d"]
    assert "higher is better" in axes.get_title()
