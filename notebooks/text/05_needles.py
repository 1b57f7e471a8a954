# %% [markdown]
# # 5. Needles in a haystack: long context, every cell cold
#
# Broken long-context numerics (RoPE tables past a length, a chunked-prefill seam, a wrong cache state) still give
# fluent text; they lose a fact buried at some depth. Per cell of a depth by length grid the probe builds a
# token-exact haystack (counted with the server's own `/tokenize`) from filler the project generates itself, buries
# a random number at that depth, sends it cold (its own `cache_salt`), scores the answer by exact match and times it.
# The first cell at a new length may compile a new shape on Gaudi: its time is kept apart.

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recipe id (cookbook recipe list)
BASE_URL = None      # a running server, e.g. "http://127.0.0.1:8000"; None launches the recipe's own
OUT_DIR = None       # where parts, figures and the executed notebook go; None: runs/interactive/<recipe>
HARDWARE = None      # "gaudi2:four Gaudi 2 cards" when attached to a Gaudi server; None: this machine for CPU recipes
INTERACTIVE = False  # True in JupyterLab: widgets to pick a recipe and server and re-run with live progress
LENGTHS = None       # haystack lengths in this model's tokens, e.g. [2000, 4000]; None: the recipe's
DEPTHS = None        # needle depths as fractions, e.g. [0.1, 0.5, 0.9]; None: the recipe's
SEED = 0

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

    display(ui.checks_panel(["needles"], RECIPE, session.endpoint.base_url, OUT_DIR, HARDWARE))
    ui.stop_run_all()  # Run All ends here: the cells below run the suite headless, the panel does it here

# %% [markdown]
# ## The grid

# %%
from cookbook.checks import run_checks

context = session.check_context(needle_lengths=LENGTHS, needle_depths=DEPTHS, seed=SEED)
results = run_checks(context, names=["needles"])
session.write_part("needles", results)
report.checks_frame(results)

# %%
report.needles_frame(results.check("needles"))

# %%
from cookbook import plots

session.show_figure(plots.needles_figure(results.check("needles")), "needles")

# %%
if not INTERACTIVE:  # interactive: a server this notebook launched runs until the kernel stops
    session.close()  # stops the server only if this notebook launched it
