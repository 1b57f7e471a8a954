# %% [markdown]
# # 4. Prefix cache: a hit must answer exactly like a cold run
#
# The seeds' headline risk: on Gated DeltaNet hybrids a prefix-cache hit can resume from the wrong state and still
# answer fluently. Per prompt (a token-exact haystack with a needle) the probe sends the request cold (a fresh
# `cache_salt`), then the same request again until it hits (the second request, or the third in vLLM's hybrid 'align'
# mode), and compares: the text, the logprobs token by token (bit-identical, or within the recipe's tolerance), and
# `cached_tokens` (0 cold; on a hit a multiple of the block size, below the prompt length; a prompt shorter than one
# block never hits). With prefix caching off in the recipe it checks that nothing is ever cached.

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recipe id (cookbook recipe list)
BASE_URL = None      # a running server, e.g. "http://127.0.0.1:8000"; None launches the recipe's own
OUT_DIR = None       # where parts, figures and the executed notebook go; None: runs/interactive/<recipe>
HARDWARE = None      # "gaudi2:four Gaudi 2 cards" when attached to a Gaudi server; None: this machine for CPU recipes
INTERACTIVE = False  # True in JupyterLab: widgets to pick a recipe and server and re-run with live progress
PROMPT_TOKENS = None  # prompt lengths in this model's tokens, e.g. [300, 1500, 7000]; None: the recipe's
SEED = 0              # needle values and filler text per prompt

# %%
from IPython.display import display

from cookbook import report
from cookbook.session import open_session

report.setup_display()
session = open_session(RECIPE, BASE_URL, OUT_DIR, HARDWARE)
print(f"{session.recipe.id} at {session.endpoint.base_url} (model {session.endpoint.model}); results in {session.out_dir}")

# %%
if INTERACTIVE:
    from cookbook import ui

    display(ui.checks_panel(["prefix-cache"], RECIPE, session.endpoint.base_url, OUT_DIR, HARDWARE))
    ui.stop_run_all()  # Run All ends here: the cells below run the suite headless, the panel does it here

# %% [markdown]
# ## Hit versus cold

# %%
from cookbook.checks import run_checks

context = session.check_context(prefix_cache_prompt_tokens=PROMPT_TOKENS, seed=SEED)
results = run_checks(context, names=["prefix-cache"])
session.write_part("prefix_cache", results)
report.checks_frame(results)

# %% [markdown]
# Per prompt: cached tokens on each request (cold first), whether the hit's text and logprobs match the cold run's, and the time of each.

# %%
report.prefix_cache_frame(results.check("prefix-cache"))

# %%
from cookbook import plots

session.show_figure(plots.prefix_cache_figure(results.check("prefix-cache")), "prefix_cache")

# %%
if not INTERACTIVE:  # interactive: a server this notebook launched runs until the kernel stops
    session.close()  # stops the server only if this notebook launched it
