"""The README a newcomer reads: short, its links lead somewhere, and every command it shows is a real one.

Every relative link in README.md, docs/*.md and benchmarks/README.md must name an existing file (and, for a Markdown
file, an existing heading anchor); every `cookbook ...` line in the README's code blocks is parsed by the real
parser, and the ones that need no server run for real here; every `make ...` line names a Makefile target; the
"Add your model" steps run in their order on a checkpoint the project has never seen.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from cookbook import recipe_new
from cookbook.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_LINES = 200
BASES = (ROOT, ROOT / "cookbook", ROOT / "fixes", ROOT / "notebooks")  # a name in a folder's Layout line is in it
# (command, action) whose README lines run here in seconds: they read recipes and write files, no server, no card.
RUN_FOR_REAL = {("recipe", "list"), ("recipe", "show"), ("recipe", "validate"), ("recipe", "launch-script"),
                ("recipe", "container"), ("doctor", None), ("k8s", "render"), ("page", None)}
# Flags whose value is a server or a run folder: a line with one is parsed, not run.
NEEDS_MORE = {"--base-url", "--launch", "--results", "--fleet", "--fleet-results"}

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _code_blocks(text: str) -> list[str]:
    return [block.split("\n", 1)[1].rsplit("```", 1)[0] for block in _FENCE.findall(text)]


def _prose(text: str) -> str:
    """The text without code blocks and inline code, where a `[x](y)` is not a link."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = base = _slug(match.group(1))
            n = 0
            while slug in found:  # a repeated heading gets -1, -2, ... as on GitHub
                n += 1
                slug = f"{base}-{n}"
            found.add(slug)
    return found


def relative_links(page: Path) -> list[str]:
    links = [a or b for a, b in _LINK.findall(_prose(page.read_text(encoding="utf-8")))]
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]  # http:, mailto: ...


def broken_links(page: Path) -> list[str]:
    broken = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {target or page.name}")
    return broken


def readme_lines(prefix: str) -> list[tuple[str, list[str]]]:
    """(the line as shown, its words without the comment) for every README code-block line starting with prefix."""
    found = []
    for block in _code_blocks(README.read_text(encoding="utf-8")):
        for line in block.splitlines():
            if line.startswith(prefix + " "):
                found.append((line.strip(), shlex.split(line, comments=True)))
    return found


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md: no section '## {title}'"
    return match.group(1)


COOKBOOK_LINES = readme_lines("cookbook")
MAKE_LINES = readme_lines("make")


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < MAX_LINES, f"README.md: {lines} lines, the limit is {MAX_LINES - 1}"


def test_the_quick_start_is_the_two_commands_and_says_where_the_suites_time_goes() -> None:
    quick = section("Quick start")
    assert [w for _, w in readme_lines("make") if w][:2] == [["make", "demo"], ["make", "test"]]
    assert [line.split("#")[0].strip() for line in _code_blocks(quick)[0].splitlines() if line.strip()] == \
        ["make demo", "make test"]
    assert "Where the suite's time goes: see [benchmarks/README.md](benchmarks/README.md) (Suite time)." in quick
    tests = section("Tests").strip().splitlines()
    assert len(tests) <= 8, f"README.md: '## Tests' has {len(tests)} lines, at most 8"


def test_add_your_model_shows_new_validate_doctor_verify_in_that_order() -> None:
    words = [shlex.split(line, comments=True)[1:3] for block in _code_blocks(section("Add your model"))
             for line in block.splitlines() if line.startswith("cookbook ")]
    assert [w[0] if w[0] != "recipe" else f"recipe {w[1]}" for w in words] == \
        ["recipe new", "recipe validate", "doctor", "verify"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: " + "; ".join(broken_links(page))


def test_the_link_checker_sees_a_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Real heading, with `code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#real-heading-with-code) [ok](b.md#twice-1) [gone](c.md) [bad](b.md#nope) [x](#x)\n"
                    "`[not a link](nowhere.md)` [web](https://example.com/x.md)\n```\n[code](nowhere.md)\n```\n")
    assert broken_links(page) == ["c.md: no such file", "b.md#nope: no heading #nope in b.md",
                                  "#x: no heading #x in a.md"]


def test_the_readme_shows_cookbook_and_make_lines() -> None:
    assert len(COOKBOOK_LINES) >= 15 and len(MAKE_LINES) >= 5
    assert {w[1] for _, w in COOKBOOK_LINES} == set(COMMANDS)  # every command is shown once at least


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {t for m in re.finditer(r"^([A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)*)\s*:(?!=)", text, re.M)
            for t in m.group(1).split()}


@pytest.mark.parametrize(("line", "words"), MAKE_LINES, ids=[line for line, _ in MAKE_LINES])
def test_make_line_names_a_target(line: str, words: list[str]) -> None:
    missing = [t for t in words[1:] if "=" not in t and not t.startswith("-") and t not in _makefile_targets()]
    assert not missing, f"README.md: `{line}`: no Makefile target {missing}"


def _action(words: list[str]) -> str | None:
    return words[2] if words[1] in ("recipe", "k8s", "reference") and len(words) > 2 else None


def _outs_into(words: list[str], tmp_path: Path) -> list[str]:
    """The words with every `--out DIR` moved under tmp_path, so running a line writes nothing in the checkout."""
    return [str(tmp_path / w) if i and words[i - 1] == "--out" else w for i, w in enumerate(words)]


def _add_your_model_paths() -> set[str]:
    return {w for block in _code_blocks(section("Add your model")) for w in shlex.split(block, comments=True)
            if "/" in w and w.startswith(("/", "recipes/"))}


@pytest.mark.parametrize(("line", "words"), COOKBOOK_LINES, ids=[line for line, _ in COOKBOOK_LINES])
def test_cookbook_line_parses_and_runs_where_it_can(line: str, words: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert words[1] in COMMANDS, f"README.md: `{line}`: no command {words[1]!r}"
    try:
        args = build_parser(words[1]).parse_args(words[1:])
    except SystemExit as exc:
        pytest.fail(f"README.md: `{line}`: the parser refuses it (exit {exc.code}): {capsys.readouterr().err.strip()}")
    assert args.command == words[1]
    runs = (words[1], _action(words)) in RUN_FOR_REAL and not NEEDS_MORE & set(words)
    if not runs or _add_your_model_paths() & set(words):  # the Add-your-model steps run in their own test
        return
    monkeypatch.chdir(ROOT)
    code = main(_outs_into(words, tmp_path)[1:])
    allowed = {0, 1} if "exit 1" in line.partition("#")[2] else {0}  # `doctor RECIPE`: 1 when this box cannot run it
    assert code in allowed, f"README.md: `{line}`: exit {code}: {capsys.readouterr().err.strip()}"


def _llama_like(folder: Path) -> None:
    """A checkpoint as `recipe new` reads it, of Llama 3.1 8B's facts: config.json, a weights index, a template."""
    folder.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
              "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
    (folder / "config.json").write_text(json.dumps(config))
    index = {"metadata": {"total_size": 16_060_522_496},
             "weight_map": {t: "model-00001-of-00004.safetensors" for t in ("model.embed_tokens.weight", "lm_head.weight")}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "<|python_tag|>{{ messages }}"}))


def test_add_your_model_runs_as_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The section's lines as written, in a scratch folder standing for the checkout (its recipes/ there) with the
    checkpoint built where the line names it; `verify` needs the served model and is parsed only (above)."""
    lines = [line for block in _code_blocks(section("Add your model")) for line in block.splitlines()
             if line.startswith("cookbook ")]
    checkpoint = shlex.split(lines[0])[3]
    _llama_like(tmp_path / checkpoint.lstrip("/"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(recipe_new, "RECIPES_DIR", tmp_path / "recipes")
    for line in lines[:3]:
        words = [str(tmp_path / w.lstrip("/")) if w == checkpoint else w for w in shlex.split(line, comments=True)]
        code = main(words[1:])
        allowed = {0, 1} if "exit 1" in line.partition("#")[2] else {0}
        assert code in allowed, f"README.md: `{line}`: exit {code}: {capsys.readouterr().err.strip()}"
    written = shlex.split(lines[1])[3]
    assert (tmp_path / written).is_file(), f"README.md: `{lines[0]}` did not write {written}"



def test_every_path_the_layout_names_exists() -> None:
    words = {w.rstrip(",") for block in _code_blocks(section("Layout")) for w in block.split()}
    named = {w for w in words if re.fullmatch(r"[\w.*-]+(/[\w.*-]*)+|[\w-]+\.(py|yml|toml)|Makefile", w)}
    assert len(named) >= 15, sorted(named)
    missing = [w for w in sorted(named) if not any(any(base.glob(w.rstrip("/"))) for base in BASES)]
    assert not missing, f"README.md, Layout: no such file or folder {missing}"
