"""docs/recipe-reference.md is the schema's own words (issue 23, item 4): regenerated from cookbook/recipes.py here,
it must equal the committed file, so a field added or described differently (the `Fixes` model grows) fails until
`scripts/in-env.sh python scripts/recipe_reference.py` is rerun."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from cookbook.recipes import Recipe

from scripts_under_test import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "recipe_reference.py"
DOC = ROOT / "docs" / "recipe-reference.md"


def _generator():  # type: ignore[no-untyped-def]
    return load_script(SCRIPT)


def _models() -> list[type[BaseModel]]:
    """Recipe and every model it nests, found here independently of the generator."""
    found: list[type[BaseModel]] = [Recipe]
    for model in found:
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                kind = stack.pop()
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    if kind not in found:
                        found.append(kind)
                else:
                    stack += list(getattr(kind, "__args__", ()))
    return found


def test_the_committed_reference_is_what_the_schema_generates() -> None:
    assert DOC.read_text(encoding="utf-8") == _generator().render(), (
        "docs/recipe-reference.md is out of date: run scripts/in-env.sh python scripts/recipe_reference.py")


def test_every_field_of_every_nested_model_is_in_the_reference() -> None:
    text = _generator().render()
    models = _models()
    assert len(models) >= 15 and any(m.__name__ == "Fixes" for m in models)
    for model in models:
        assert f"\n## {model.__name__}\n" in text, model.__name__
        body = text.split(f"\n## {model.__name__}\n", 1)[1].split("\n## ", 1)[0]
        for name, field in model.model_fields.items():
            row = next((line for line in body.splitlines() if line.startswith(f"| `{field.alias or name}` |")), None)
            assert row is not None, f"{model.__name__}.{name} missing"
            if field.description:
                assert " ".join(field.description.split()).replace("|", "\\|") in row, f"{model.__name__}.{name}"


def test_check_mode_says_when_the_file_is_stale(tmp_path: Path) -> None:
    generator = _generator()
    generator.OUT = tmp_path / "recipe-reference.md"
    generator.OUT.write_text("stale\n")
    generator.ROOT = tmp_path
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0 and generator.main(["--check"]) == 0
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
