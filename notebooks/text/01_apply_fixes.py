# %% [markdown]
# # 1. The fix pack: what the recipe's image needs before `vllm serve`
#
# A recipe names a fix profile for its image (`v0.26.0` for the vllm-gaudi release of the seeds, `cpu-0.32.0` for the
# CPU image here) and any opt-in fixes. `fixes/apply_all.py` applies them at every container start, all or nothing,
# and stops with a non-zero exit code if the image does not match: it is the only route by which anything changes in
# an image. This notebook shows which fixes the recipe depends on and why, then asks the tool, in the recipe's image,
# what state each fix is in. With `APPLY = True` it applies them, exactly as the launcher does before serving.

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recipe id (cookbook recipe list)
BASE_URL = None      # not used here: fixes act on the image, not on a server (every notebook takes the same parameters)
OUT_DIR = None       # where fix_state.json goes; None: runs/interactive/<recipe>
HARDWARE = None      # not used here
APPLY = False        # True: apply the profile (what the launcher does at start-up); False: read the state only
IMAGE_PYTHON = None  # the image's interpreter; None: the CPU image for CPU recipes, else this machine's python3
INTERACTIVE = False

# %%
import pandas as pd
from IPython.display import Markdown, display

from cookbook import report
from cookbook.recipes import load_recipe, render_launch_block
from cookbook.session import fix_state, required_fixes_frame, save_json

report.setup_display()
recipe = load_recipe(RECIPE)
display(Markdown(f"The recipe's launch block, whose fix step this is:\n\n```sh\n{render_launch_block(recipe)}```"))

# %%
if INTERACTIVE:
    from cookbook import ui

    display(ui.fixes_panel(RECIPE, apply=APPLY))
    ui.stop_run_all()  # Run All ends here: the cells below run the suite headless, the panel does it here

# %% [markdown]
# ## Required fixes: why this model needs each one

# %%
required_fixes_frame(recipe)

# %% [markdown]
# ## State in the image
#
# Per fix and per file: pristine, applied or modified (drift). On a machine without the recipe's image (a Gaudi recipe
# here) the tool says so, exits non-zero and changes nothing.

# %%
state = fix_state(recipe, apply=APPLY, python=IMAGE_PYTHON)
save_json(state, OUT_DIR, recipe, "fix_state.json")
print(f"apply_all.py exit code {state.exit_code}" + (f": {state.error}" if state.error else ""))
pd.DataFrame(state.fixes)

# %%
pd.DataFrame(state.files)
