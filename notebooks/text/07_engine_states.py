# %% [markdown]
# # 7. Engine states: same-step prefixes, preemption, chunked prefill, batch composition
#
# Several fixes of the v0.26.0 profile exist for engine states that ordinary requests never reach: a request reading a
# cache block another request writes in the same scheduler step (`prompt-order`), a request preempted and resumed
# (`resumed-prefill-logits`, `async-discard-counter`), `prompt_logprobs` over a prefill split into chunks
# (`prompt-logprobs`), and the kernels' batch shape. Each probe drives the engine into its state, compares every output
# token by token with a solo cold run of the same request (fresh `cache_salt`), and says **inconclusive** (never pass)
# when it could not reach the state, with why. A first differing token is a tie only when the two candidates are within
# the recipe's `tie_margin` in the solo run's top-k.

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recipe id (cookbook recipe list)
BASE_URL = None      # a running server, e.g. "http://127.0.0.1:8000"; None launches the recipe's own
OUT_DIR = None       # where parts, figures and the executed notebook go; None: runs/interactive/<recipe>
HARDWARE = None      # "gaudi2:four Gaudi 2 cards" when attached to a Gaudi server; None: this machine for CPU recipes
INTERACTIVE = False  # True in JupyterLab: widgets to pick a recipe and server and re-run with live progress
LAUNCH_PROFILE = None  # e.g. "engine-states": preemption and chunked prefill on a server started with the recipe's
                       # small-pool profile (one extra start); None: every probe on the server above
BATCH_SIZES = [2, 4]   # batch sizes besides 1 (the solo runs); the recipe's --max-num-seqs is the largest useful
CHUNKED_PROMPT_TOKENS = 2500  # prompt_logprobs prompt length; None: three and a half prefill chunks (capped to context)
SEED = 0               # filler text of the prompts

# %%
from IPython.display import display
import pandas as pd

from cookbook import report
from cookbook.session import open_session

report.setup_display()
session = open_session(RECIPE, BASE_URL, OUT_DIR, HARDWARE)
print(f"{session.recipe.id} at {session.endpoint.base_url} (model {session.endpoint.model}); results in {session.out_dir}")

# %%
if INTERACTIVE:
    from cookbook import ui

    display(ui.checks_panel(["same-step-prefix", "preemption", "chunked-prompt-logprobs", "batch-composition"],
                            RECIPE, session.endpoint.base_url, OUT_DIR, HARDWARE))
    ui.stop_run_all()  # Run All ends here: the cells below run the suite headless, the panel does it here

# %% [markdown]
# ## Run the probes
#
# With `LAUNCH_PROFILE` set, preemption and chunked prefill run on a second server of the recipe started with that
# profile (a KV pool smaller than the probe's load, small prefill chunks) and stopped after; on a server whose pool
# holds any load it accepts, the preemption probe is inconclusive and says so.

# %%
from cookbook.checks.engine_states import comparison_rows, run_engine_states

context = session.check_context(batch_sizes=BATCH_SIZES, chunked_prompt_tokens=CHUNKED_PROMPT_TOKENS, seed=SEED)
results = run_engine_states(context, LAUNCH_PROFILE)
session.write_part("engine_states", results)
report.checks_frame(results)

# %% [markdown]
# Every request against its solo run: identical tokens, the largest logprob difference over the tokens both share,
# and where a run first left its solo run (a tie within the recipe's margin, or a fail).

# %%
pd.DataFrame(comparison_rows(results))

# %% [markdown]
# Green: the same tokens as alone; amber: a departure the model's reference calls a near-tie (or where the solo run was
# the one off); red: one that fails.
# The dashed line is the largest logprob difference the recipe allows.

# %%
from cookbook import plots

session.show_figure(plots.engine_states_figure(results), "engine_states")

# %%
for c in results.checks:
    print(f"{c.name}: {c.status} in {c.duration_s:.0f} s: {c.result}")

# %%
if not INTERACTIVE:  # interactive: a server this notebook launched runs until the kernel stops
    session.close()  # stops the server only if this notebook launched it
