"""Recipe pages: a recipe plus a run's results rendered as Markdown in the structure of the published seed pages.

Title and summary, an at-a-glance table, Launch (the recipe's own launch block), Prefix caching, Buckets,
Required fixes (fix | why this model needs it), Verified (with the note that says which hardware produced it and
the KV pool), Performance ("measured as" wording), Known issues, What not to do. A seed recipe's default results
are the published ones stored beside it (`results.json`, `source: published`); a measured run passes its own.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from pathlib import Path

from .errors import ResultsError
from .fixpack import ModelTraits, RequiredFix, engine, load_pack
from .recipes import REPO_ROOT, Recipe, render_launch_block
from .results import RunResults, read_results
from .secrets import scrub_file_text

RESULTS_FILE = "results.json"
Row = tuple[str, str]


def default_results(recipe: Recipe) -> RunResults | None:
    """The results stored beside the recipe (the published figures for the seed recipes), if any."""
    path = recipe.folder / RESULTS_FILE
    if not path.exists():
        return None
    results = read_results(path)
    if results.recipe != recipe.id:
        raise ResultsError(f"{path}: recipe: says {results.recipe!r}, but the file sits beside {recipe.id!r}")
    return results


# ---------------------------------------------------------------------------------------------------------------
# Table rows (also what tests compare with the seeds, and what the notebooks show as DataFrames)


def glance_rows(recipe: Recipe) -> list[Row]:
    """The at-a-glance table: model, hardware, image, precision, context, concurrency, parsers, recipe path."""
    parsers = []
    if recipe.tool_parser:
        parsers.append(f"tools `{recipe.tool_parser}`")
    if recipe.reasoning_parser:
        parsers.append(f"reasoning `{recipe.reasoning_parser}`")
    context = f"{recipe.max_model_len:,}" + (f" ({recipe.context_note})" if recipe.context_note else "")
    try:
        where = recipe.path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        where = str(recipe.path)
    return [
        ("Model", recipe.model.id),
        ("Hardware", recipe.hardware.description),
        ("Image", recipe.image.label),
        ("Precision", recipe.precision.description),
        ("Context", context),
        ("Concurrency", f"`--max-num-seqs {recipe.max_num_seqs}`"),
        ("Parsers", ", ".join(parsers) or "none"),
        ("Recipe", f"`{where}`"),
    ]


def model_traits(recipe: Recipe) -> ModelTraits:
    """The facts of a recipe's model and serving that the pack's relevance rules read."""
    flags = recipe.serve.flags
    batched = flags.get("max-num-batched-tokens")
    lazy = recipe.environment.get("PT_HPU_LAZY_MODE")
    return ModelTraits(
        architecture=recipe.model.architecture, hybrid=recipe.model.hybrid, moe=recipe.model.experts_total > 0,
        experts_total=recipe.model.experts_total, experts_active=recipe.model.experts_active,
        fp8=recipe.precision.dtype == "fp8", prefix_caching=recipe.prefix_caching.enabled,
        enforce_eager=flags.get("enforce-eager") is True,
        lazy_mode=False if recipe.hardware.kind == "cpu" else None if lazy is None else lazy.strip() != "0",
        tensor_parallel=recipe.hardware.tensor_parallel, max_model_len=recipe.max_model_len,
        max_num_batched_tokens=batched if isinstance(batched, int) and not isinstance(batched, bool) else None,
        vocab_size=recipe.model.vocab_size)


def required_fix_rows(recipe: Recipe) -> list[RequiredFix]:
    """The recipe's fixes as its page lists them: its own per-model why when it has one (the seeds); else each fix
    the profile applies, with the reason the pack gives for a model with this recipe's facts, or as applied by the
    profile and not needed by this model (never another model's reason)."""
    why = dict(recipe.fixes.why)
    return load_pack().required_fixes(recipe.fixes.profile, recipe.fixes.opt_in, why,
                                      None if why else model_traits(recipe))


def fix_rows(recipe: Recipe) -> list[Row]:
    """Required fixes: fix (with "(opt-in)" from the fix pack's metadata) and why this model needs it."""
    return [(f"`{row.id}`" + (" (opt-in)" if row.opt_in else ""), row.why) for row in required_fix_rows(recipe)]


def fix_proof_line(recipe: Recipe) -> str:
    """One line under Required fixes: what the pack has shown of these fixes and where, grouped by the pack's own
    labels (`apply_all.py --list`), so a page never claims more than a test showed."""
    groups: dict[str, list[str]] = {}
    hooks: list[str] = []
    for row in [r for r in required_fix_rows(recipe) if r.needed is not False]:
        proof = row.fix.proof
        label = row.fix.proof_label.removesuffix(f"; {engine().base.HOOK_LABEL}")
        groups.setdefault(label, []).append(f"`{row.id}`")
        if proof is not None and proof.hook:
            hooks.append(f"`{row.id}`")
    parts = [f"{label}: {', '.join(ids)}" for label, ids in groups.items()]
    if not hooks and set(groups) == {engine().base.SERVED_LABEL}:
        return "What the fix pack has shown of these fixes: each is shown by its check on the served model (Verified)."
    if hooks:
        parts.append(f"hooks into vLLM from a vllm_gaudi file: {', '.join(hooks)}")
    return ("What the fix pack has shown of these fixes (no fix was run on a Gaudi card by this project): "
            + "; ".join(parts) + ".")


def verified_rows(results: RunResults) -> list[Row]:
    """Check | Result. A measured check that did not pass says so in its result cell."""
    rows = []
    for check in results.checks:
        text = check.result
        if check.status in ("fail", "error") and check.status not in text.lower():
            text = f"{text} ({check.status})"
        rows.append((check.label, text))
    return rows


# Figures that stand behind the table rather than in it (the run's report shows them).
DETAIL_FIGURES = frozenset({"sweep"})


def performance_rows(results: RunResults) -> list[Row]:
    """The seeds' Performance rows; the concurrency sweep stays in the report, not on the page."""
    rows = []
    for figure in results.performance:
        if figure.name in DETAIL_FIGURES:
            continue
        text = figure.result
        if figure.failed_requests:
            text = f"{text} ({figure.failed_requests} failed requests)"
        rows.append((figure.label, text))
    return rows


# A note that says the run used "exactly the launch command above" is kept only where that very block is shown.
LAUNCH_CLAIM = "launch command above"


def published_label(results: RunResults) -> str | None:
    """For results that came with the recipe (`source: published`): said in so many words, with the hardware and
    image that produced them; None for results this checkout measured."""
    if results.source != "published":
        return None
    image = results.image or "an image the results do not name"
    return (f"Published results: they came with this recipe and were not reproduced by this checkout "
            f"(measured by the recipe's authors on {results.hardware.description}, {image}).")


def shows_run_command(results: RunResults, shown_launch: str | None) -> bool:
    """True when the page or report shows the very Launch block the run started its server with."""
    return bool(results.launch_block) and shown_launch is not None and results.launch_block == shown_launch


def verified_note(results: RunResults, shown_launch: str | None = None) -> str:
    """The sentence under Verified: always names the hardware and image that produced the results. A note that
    claims 'exactly the launch command above' stands only when `shown_launch` (the block shown above it) is the
    one the run recorded; otherwise it is replaced by one that says the command is not shown."""
    image = results.image or "an image the results do not name"
    note = results.verified_note
    if note and LAUNCH_CLAIM in note and not shows_run_command(results, shown_launch):
        which = "other than the launch block shown here" if results.launch_block else "that the results do not record"
        note = (f"On {image}, {results.hardware.description}, with a launch command {which}. "
                "Requests went to the OpenAI-compatible API.")
    if note:
        return note
    when = f", {results.started_at[:10]}" if results.started_at else ""
    return f"Measured on {results.hardware.description}, {image}{when}. Requests went to the OpenAI-compatible API."


def performance_note(results: RunResults) -> str:
    if results.performance_note:
        return results.performance_note
    ways = list(dict.fromkeys(f.measured_as for f in results.performance if f.measured_as))
    measured = f" (measured as: {'; '.join(ways)})" if ways else ""
    return f"Single runs on the server above{measured}."


def markdown_table(header: Row, rows: list[Row]) -> str:
    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = [f"| {cell(header[0])} | {cell(header[1])} |", "| --- | --- |"]
    lines += [f"| {cell(a)} | {cell(b)} |" for a, b in rows]
    return "\n".join(lines)


def _bullets(items: list[str]) -> str:
    return "\n".join(f"- {item}" for item in items)


def _launch_intro(recipe: Recipe) -> str:
    if recipe.image.kind == "vllm-cpu":
        return (
            "`$COOKBOOK` is this checkout and `$COOKBOOK_MODELS` the folder `cookbook setup` prepares the weights in; "
            f"`cookbook serve {recipe.id}` runs exactly these steps in the CPU image's environment."
        )
    return "Run inside a vllm-gaudi container. `$COOKBOOK` is a checkout of this repository there."


def _container_line(recipe: Recipe) -> str | None:
    if recipe.image.kind != "vllm-gaudi":
        return None
    return (f"`cookbook doctor {recipe.id}` checks the box first; `cookbook recipe container {recipe.id}` prints the "
            "`docker run` that starts the container and runs these steps (see Using a recipe).")


# The project docs the pages name; a mention in a page's prose becomes a link (relative to the checkout's root).
DOC_LINKS = {
    "Using a recipe": "docs/using-a-recipe.md",
    "Prefix caching on Gated DeltaNet hybrids": "docs/gdn-prefix-caching.md",
}


def link_docs(text: str) -> str:
    """Mentions of the project's docs (as the seeds write them) as Markdown links."""
    for title, target in DOC_LINKS.items():
        text = text.replace(title, f"[{title}]({target})")
    return text


HARDWARE_NAMES = {"gaudi2": "Gaudi 2", "gaudi3": "Gaudi 3", "cpu": "CPU"}


def _params(count: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if count >= size:
            return f"{int(count / size + 0.5)}{unit}"
    return f"{count:.0f}"


def header_lines(recipe: Recipe, results: RunResults | None) -> list[str]:
    """The seeds' header card: what verified it and the model's Hugging Face link, the badges, then Hardware,
    Image, Variant and Fixes (profile, opt-ins, how many fixes the configuration depends on), each as a label line
    and a value line."""
    where = HARDWARE_NAMES.get(results.hardware.kind, results.hardware.description) if results else None
    badge = (f"Verified on {where}" + (" (published results)" if results and results.source == "published" else "")
             if results else "Not verified yet")
    links = [f"**{badge}**"]
    if recipe.serve.weights is None and not recipe.model.id.startswith(("/", "./", "$")):  # a hub id, not a path
        links.append(f"[Hugging Face](https://huggingface.co/{recipe.model.id})")
    m = recipe.model
    size = _params(m.params_total) + (f" / {_params(m.params_active)} active" if m.params_active < m.params_total else "")
    tags = [t for t in m.tags if t != "text"]
    image = recipe.image
    badges = [*tags, size, f"{recipe.max_model_len:,} ctx served", recipe.precision.dtype, f"{image.kind} {image.tag}"]
    if "text" in m.tags:
        badges.append("Text")
    hw = recipe.hardware
    if hw.kind == "cpu":
        hardware = hw.description
    else:
        hardware = f"{hw.cards} card{'s' if hw.cards > 1 else ''} · TP {hw.tensor_parallel}" + (" · EP" if hw.expert_parallel else "")
    pins = (f"vllm-gaudi {image.tag} @ {image.commit} · vLLM @ {image.vllm_commit} · Gaudi SW {image.gaudi_sw}"
            if image.kind == "vllm-gaudi" else f"{image.kind} {image.tag}")
    depends = len(recipe.fixes.why) or sum(row.needed is True for row in required_fix_rows(recipe))
    card = [" · ".join(links), " · ".join(badges), "**Hardware**", hardware, "**Image**", pins]
    if recipe.variant:
        card += ["**Variant**", recipe.variant]
    card += ["**Fixes**", " ".join([f"profile {recipe.fixes.profile}", *recipe.fixes.opt_in]),
             f"{depends} fix{'es' if depends != 1 else ''} this configuration depends on; opt-in fixes are named."]
    return card


def _first(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text)
    return match.group(1) if match else None


# Checks whose effect the seeds sum up in one bullet, with the words they use for each.
EFFECT_WORDS = {"top-logprobs": "top_logprobs 20", "prompt-logprobs": "prompt_logprobs", "json-schema": "JSON schema",
                "logit-bias": "logit_bias", "min-p": "min_p", "min-tokens": "min_tokens", "bad-words": "bad_words",
                "seed": "seed"}


def passed_bullets(recipe: Recipe, results: RunResults) -> list[str]:
    """At a glance, "Checks that passed": the seeds' bullets, built from the checks that passed and the figures."""
    passed = {c.name: c for c in results.checks if c.status == "pass"}
    bullets = []
    known, concurrent = passed.get("known-answer"), passed.get("known-answer-concurrent")
    if known and concurrent:
        flight = _first(r"(\d+) in flight", concurrent.label) or str(recipe.verification.concurrency or recipe.max_num_seqs)
        bullets.append(f"Known-answer prompts {known.result} at temperature 0 and {concurrent.result} with {flight} in flight")
    tools = [passed.get(n) for n in ("tool-call-auto", "tool-call-streamed", "tool-result")]
    if all(tools):
        auto = tools[0]
        assert auto is not None
        count = _first(r"^(\d+/\d+)", auto.result) or auto.result
        sampled = _first(r"sampled at ([\d.]+)", auto.label)
        bullets.append(f"Tool calls: {count} valid calls" + (f" sampled at {sampled}" if sampled else "")
                       + ", streamed call assembled, tool result used in the answer")
    effects = [words for name, words in EFFECT_WORDS.items() if name in passed]
    if effects:
        listed = effects[0] if len(effects) == 1 else ", ".join(effects[:-1]) + " and " + effects[-1]
        healthy = "; server healthy after each" if "server-health" in passed else ""
        bullets.append(f"{listed} {'takes' if len(effects) == 1 else 'all take'} effect{healthy}")
    cache = passed.get("prefix-cache")
    if cache:
        prompts = re.search(r"(\d+) prompts of (\S+ to \S+) tokens", cache.label)
        what = f", {prompts.group(1)} greedy prompts of {prompts.group(2)} tokens" if prompts else ""
        bullets.append(f"Prefix-cache hit vs cold{what}: {cache.result}")
    needles = passed.get("needles")
    if needles:
        depths = _first(r"(\d+) depths", needles.label)
        bullets.append(f"Needles, {depths + ' depths each, ' if depths else ''}cold: {needles.result}")
    one, many = results.figure("single-stream"), results.figure("n-streams")
    if one and many and not one.failed_requests and not many.failed_requests:
        rate, total = one.metrics.get("tokens_per_s"), many.metrics.get("aggregate_tokens_per_s")
        streams, tokens = many.metrics.get("streams"), many.metrics.get("output_tokens")
        if rate is not None and total is not None and streams and tokens:
            bullets.append(f"Single stream {rate:g} tokens/s, {streams:g} streams {total:g} tokens/s aggregate "
                           f"({tokens:g} tokens, end to end)")
    return bullets


def smoke_test(recipe: Recipe, port: int = 8000, max_tokens: int = 512) -> str:
    """A `curl` that asks the running server for one sentence: the first thing to try once it is up."""
    body = json.dumps({"model": recipe.served_model_name,
                       "messages": [{"role": "user", "content": "Say hello in one sentence."}], "max_tokens": max_tokens})
    return (f"curl -s http://localhost:{port}/v1/chat/completions \\\n"
            "  -H 'Content-Type: application/json' \\\n"
            f"  -d {shlex.quote(body)}\n")


# ---------------------------------------------------------------------------------------------------------------
# The page


def render_page(recipe: Recipe, results: RunResults | None = None) -> str:
    """The recipe page in Markdown. `results` defaults to nothing: pass `default_results(recipe)` for the stored ones."""
    if results is not None and results.recipe != recipe.id:
        raise ResultsError(f"--results: results of {results.recipe!r}, not of recipe {recipe.id!r}")
    parts: list[str] = [f"# {recipe.title}", recipe.model.summary.strip(), "  \n".join(header_lines(recipe, results))]

    shown_launch = render_launch_block(recipe)
    launch = ["## Launch", _launch_intro(recipe), f"```sh\n{shown_launch}```"]
    container = _container_line(recipe)
    if container:
        launch.append(link_docs(container))
    launch += ["Once it is up, a smoke test:", f"```sh\n{smoke_test(recipe)}```"]
    parts += launch

    bullets = passed_bullets(recipe, results) if results is not None else []
    if bullets or recipe.serve.notes:
        parts.append("## At a glance")
    if bullets:
        label = published_label(results) if results is not None else None
        parts += ["**Checks that passed**" + (" (published results, not reproduced by this checkout)" if label else ""),
                  _bullets(bullets)]
    if recipe.serve.notes:
        parts += ["**Notes**", _bullets(recipe.serve.notes)]

    description = recipe.model.description.strip()
    if description and description not in recipe.model.summary:
        parts += ["## Guide", description]
    parts.append(markdown_table(("", ""), glance_rows(recipe)))

    caching = recipe.prefix_caching
    parts += ["## Prefix caching", link_docs(caching.notes.strip()) or ("Prefix caching is on." if caching.enabled else "Prefix caching is off.")]
    if recipe.buckets:
        parts += ["## Buckets", recipe.buckets]

    parts.append("## Required fixes")
    if recipe.fixes.note:
        parts.append(link_docs(recipe.fixes.note.strip()))
    rows = fix_rows(recipe)
    parts.append(markdown_table(("Fix", "Why this model needs it"), rows) if rows else "No fix beyond the profile.")
    if rows:
        parts.append(fix_proof_line(recipe))

    parts.append("## Verified")
    if results is None:
        parts.append(f"No results for this recipe yet: `cookbook run {recipe.id}` measures them.")
    else:
        label = published_label(results)
        if label:
            parts.append(label)
        parts.append(verified_note(results, shown_launch))
        if results.checks:
            parts.append(markdown_table(("Check", "Result"), verified_rows(results)))
        else:
            parts.append("No checks in these results.")
        if results.kv_pool_tokens is not None:
            parts.append(f"KV pool at start-up: {results.kv_pool_tokens:,} tokens.")

    if results is not None and results.performance:
        parts.append("## Performance")
        label = published_label(results)
        if label:
            parts.append(label)
        parts.append(performance_note(results))
        parts.append(markdown_table(("Test", "Result"), performance_rows(results)))

    if recipe.known_issues:
        parts += ["## Known issues", _bullets(recipe.known_issues)]
    if recipe.do_not:
        parts += ["## What not to do", _bullets(recipe.do_not)]
    return "\n\n".join(parts) + "\n"


def write_atomic(path: Path, text: str) -> Path:
    """Write a text file via a temp file and a rename: a reader never sees it half-written. Secrets are masked
    on the way (cookbook.secrets: the one masking path every writer shares)."""
    path = Path(path)
    text = scrub_file_text(path, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
