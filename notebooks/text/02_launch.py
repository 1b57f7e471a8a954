# %% [markdown]
# # 2. Launch the server, or attach to one
#
# The recipe's Launch block is what runs: its environment, the fix profile (`fixes/apply_all.py`, which stops with a
# non-zero exit if the image does not match), then `vllm serve` with one flag a line. With `BASE_URL = None` this
# notebook carries the block out itself in the recipe's image (the CPU image here) and the server lives as long as
# the kernel in interactive use; with a `BASE_URL` it attaches to a server started elsewhere (a Gaudi container, the
# batch). Either way it then asks the server what it actually runs and compares that with the recipe.

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recipe id (cookbook recipe list)
BASE_URL = None      # a running server, e.g. "http://127.0.0.1:8000"; None launches the recipe's own
OUT_DIR = None       # where parts, figures and the executed notebook go; None: runs/interactive/<recipe>
HARDWARE = None      # "gaudi2:four Gaudi 2 cards" when attached to a Gaudi server; None: this machine for CPU recipes
INTERACTIVE = False  # True in JupyterLab: widgets to pick a recipe and server and re-run with live progress

# %%
from IPython.display import Markdown, display

from cookbook import report
from cookbook.session import facts_frame, mismatches, open_session, server_facts

report.setup_display()
session = open_session(RECIPE, BASE_URL, OUT_DIR, HARDWARE)
print(f"{session.recipe.id} at {session.endpoint.base_url} (model {session.endpoint.model}); results in {session.out_dir}")

# %% [markdown]
# ## The launch block

# %%
from cookbook.recipes import render_launch_block

display(Markdown(f"```sh\n{render_launch_block(session.recipe)}```"))

# %% [markdown]
# ## What the server says about itself
#
# From `/health`, `/v1/models` and `/metrics` (`vllm:cache_config_info`), beside what the recipe expects. A `NO`
# in the Match column means the server does not run the recipe as written.

# %%
facts = server_facts(session)
session.write_part("launch", session.new_results(kv_pool_tokens=session.endpoint.kv_pool_tokens()))
facts_frame(facts)

# %%
assert not mismatches(facts), f"the server does not run the recipe as written: {mismatches(facts)}"

# %%
if INTERACTIVE:
    from cookbook import ui

    display(ui.launch_panel(RECIPE, session.endpoint.base_url, OUT_DIR, HARDWARE))

# %% [markdown]
# In JupyterLab with `BASE_URL = None`, the server keeps running while this kernel lives: give its URL to the other notebooks. Headless, it stops here.

# %%
if not INTERACTIVE:  # interactive: a server this notebook launched runs until the kernel stops
    session.close()  # stops the server only if this notebook launched it
