"""The notebooks' session: parts that record the figures saved around them, and which recipes this machine serves."""
from __future__ import annotations

from pathlib import Path

from cookbook.endpoint import Endpoint
from cookbook.recipes import load_recipe
from cookbook.results import Hardware, read_results
from cookbook.session import Session, recipes_frame, unreachable_reason

CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_gaudi_recipes_are_unreachable_here_with_a_reason() -> None:
    assert unreachable_reason(load_recipe(CPU)) is None
    reason = unreachable_reason(load_recipe("Qwen/Qwen3-Coder-Next"))
    assert reason is not None and reason.startswith("needs 4x Gaudi 2 (TP 4) with a vllm-gaudi v0.26.0 image; here:")
    frame = recipes_frame()
    assert dict(zip(frame["Recipe"], frame["Served here"]))[CPU] == "yes"


def test_session_parts_record_figures_saved_before_and_after(tmp_path: Path) -> None:
    from matplotlib.figure import Figure as MplFigure

    recipe = load_recipe(CPU)
    session = Session(recipe, Endpoint("http://127.0.0.1:9", "m"), tmp_path, Hardware(kind="cpu", description="c"))
    first = MplFigure()
    first.subplots().plot([0, 1])
    session.save_figure(first, "before")
    session.write_part("verify", session.new_results(kv_pool_tokens=5))
    session.show_figure(first, "after")
    part = read_results(tmp_path / "parts" / "verify.json")
    assert part.artifacts == {"before": "before.png", "after": "after.png"} and part.kv_pool_tokens == 5
    assert (tmp_path / "after.png").stat().st_size > 1000
