# %% [markdown]
# # Gaudi Cookbook notebooks
#
# Bring a model up on vLLM, step by step, against any OpenAI-compatible vLLM server: the cookbook's CPU server here,
# a vllm-gaudi container on a Gaudi box. Run them in this order; each one works on its own too.
#
# | Notebook | What it does | Writes |
# | --- | --- | --- |
# | `01_apply_fixes` | The recipe's fix profile: which fixes, why this model needs each, their state in the image | `parts/fixes.json` |
# | `02_launch` | Launch the recipe's server (or attach to one) and compare what it reports with the recipe | `parts/launch.json` (KV pool) |
# | `03_verify` | The Verified table: known answers, tools, logprobs, JSON schema, logit bias, health | `parts/verify.json`, `verify.png` |
# | `04_prefix_cache` | Prefix-cache hit vs cold: identical text, logprob differences, cached tokens per block | `parts/prefix_cache.json`, `prefix_cache.png` |
# | `05_needles` | Needles in token-exact haystacks: depth by length grid | `parts/needles.json`, `needles.png` |
# | `06_throughput` | The Performance table, a concurrency sweep and the roofline | `parts/throughput.json`, `throughput.png` |
# | `07_engine_states` | Same-step shared prefixes, preemption, chunked prefill with long `prompt_logprobs`, batch composition, each against solo runs | `parts/engine_states.json` |
#
# Every notebook starts with a cell tagged `parameters` (recipe, server, lengths, concurrency, output folder) whose
# defaults are safe for CI: the CPU recipe. In JupyterLab set `INTERACTIVE = True` to get a recipe picker and run
# buttons with live progress; headless, the same notebooks run from their parameters:
#
# ```sh
# cookbook run HuggingFaceTB/SmolLM2-135M-Instruct --base-url http://127.0.0.1:8000   # every notebook, one report folder
# cookbook demo                                                                      # launch the CPU recipe, run all, stop
# ```
#
# The batch writes the executed notebooks, an HTML report per notebook (no code), `results.json`, the figures,
# `page.md` (the recipe page with this run's tables) and `index.html`. Figures always say which hardware produced them.

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the recipe the other notebooks default to
INTERACTIVE = False

# %% [markdown]
# The recipes in this checkout, and whether this machine can serve them (a Gaudi recipe needs its image and cards).

# %%
from IPython.display import display

from cookbook import report
from cookbook.session import recipes_frame

report.setup_display()
recipes_frame()

# %%
if INTERACTIVE:
    from cookbook import ui

    display(ui.recipe_picker(RECIPE))
