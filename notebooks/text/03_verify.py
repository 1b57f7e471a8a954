# %% [markdown]
# # 3. Verify: the Verified table
#
# Every check of the seeds' Verified tables, against the server: known-answer prompts at temperature 0 and with the
# recipe's concurrency in flight, tool calls, `top_logprobs`, `prompt_logprobs`, a JSON schema, `logit_bias`, the
# sampling controls behind the seeds' fixes, and the server's health (no restart during the run). A check the recipe
# marks as a known limitation of its model shows its measured result, labelled, never a pass. By default every
# check that applies to the recipe runs; in a batch run the checks that later notebooks of the set run (the
# prefix-cache probe in 04, the needles in 05) are left to them (`cookbook.batch.verify_checks`).

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recipe id (cookbook recipe list)
BASE_URL = None      # a running server, e.g. "http://127.0.0.1:8000"; None launches the recipe's own
OUT_DIR = None       # where parts, figures and the executed notebook go; None: runs/interactive/<recipe>
HARDWARE = None      # "gaudi2:four Gaudi 2 cards" when attached to a Gaudi server; None: this machine for CPU recipes
INTERACTIVE = False  # True in JupyterLab: widgets to pick a recipe and server and re-run with live progress
CHECKS = None        # e.g. ["core"] or ["known-answer", "top-logprobs"]; None: every check that applies to the recipe

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

    display(ui.verify_panel(RECIPE, session.endpoint.base_url, OUT_DIR, HARDWARE))
    ui.stop_run_all()  # Run All ends here: the cells below run the suite headless, the panel does it here

# %% [markdown]
# ## Run the checks

# %%
from cookbook.checks import run_checks

results = run_checks(session.check_context(), names=CHECKS)
session.write_part("verify", results)
report.checks_frame(results)

# %% [markdown]
# Time per check, coloured by status (green pass, amber known limitation, grey skipped, red otherwise).

# %%
from cookbook import plots

session.show_figure(plots.checks_figure(results), "verify")

# %%
print(f"{sum(c.ok for c in results.checks)}/{len(results.checks)} checks met the recipe's expectation on {results.hardware.description}")

# %%
if not INTERACTIVE:  # interactive: a server this notebook launched runs until the kernel stops
    session.close()  # stops the server only if this notebook launched it
