# %% [markdown]
# # 6. Throughput and latency: the Performance table, a sweep, the roofline
#
# The seeds' Performance table: one stream of 256 tokens, N streams (N = the recipe's `--max-num-seqs`) of 256 tokens
# each, and cold long prompts (a fresh `cache_salt` each, token-exact by `/tokenize`) timed to the answer. Every
# request streams, with a fixed output length (`ignore_eos`, `max_tokens`) and a timeout; a failed request is counted
# beside its figure. Where the needle notebook ran first on this same server (a batch), its cold cells are the cold
# figures, as the seeds time theirs ("Cold prompt of 65K tokens (needle)"): the same prompts are not prefilled twice,
# and those figures are times to the whole (non-streamed) answer. Behind the table: TTFT, inter-token latency, TPOT
# and end to end with p50 / p90 / p99, a concurrency sweep, the open loop (requests sent at a rate, Poisson arrivals,
# goodput against latency objectives, as `vllm bench serve --request-rate` measures it), and the roofline: how far
# decode runs from the bandwidth bound of the hardware that produced the figures (a CPU figure here is a CPU figure,
# never a Gaudi one).

# %% tags=["parameters"]
RECIPE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # recipe id (cookbook recipe list)
BASE_URL = None      # a running server, e.g. "http://127.0.0.1:8000"; None launches the recipe's own
OUT_DIR = None       # where parts, figures and the executed notebook go; None: runs/interactive/<recipe>
HARDWARE = None      # "gaudi2:four Gaudi 2 cards" when attached to a Gaudi server; None: this machine for CPU recipes
INTERACTIVE = False  # True in JupyterLab: widgets to pick a recipe and server and re-run with live progress
OUTPUT_TOKENS = 256  # tokens each short-prompt stream generates (the seeds: 256)
STREAMS = None       # N of the N-stream figure; None: the recipe's --max-num-seqs
LONG_LENGTHS = None  # cold prompt lengths in tokens, e.g. [2000, 7600]; None: the recipe's needle lengths
LONG_DEPTHS = None   # needle depths, one cold request each per length; None: the recipe's
SWEEP_LEVELS = None  # concurrency levels, e.g. [1, 2, 4, 8]; None: 1, 2, 4 ... up to N
RATES = [1.0, 2.0]   # offered requests/s of the open loop (a short sweep); None: 0.5, 1, 2, ... until saturated
RATE_REQUESTS = 8    # requests sent at each rate
RATE_INPUT_LEN = 32  # prompt tokens of the open loop's random prompts
RATE_OUTPUT_LEN = 32  # output tokens of each open-loop request (fixed with ignore_eos)
GOODPUT = {"ttft": 1000, "tpot": 100}  # objectives in ms (ttft, tpot, e2el): a request counts when it meets all
WORKLOADS = ["single", "streams", "cold", "sweep", "rate"]
COLD_FROM_NEEDLES = True  # cold figures from the needle notebook's cells when it ran first on this server (as the seeds do)

# %%
from IPython.display import Markdown, display

from cookbook import report
from cookbook.session import open_session

report.setup_display()
session = open_session(RECIPE, BASE_URL, OUT_DIR, HARDWARE)
print(f"{session.recipe.id} at {session.endpoint.base_url} (model {session.endpoint.model}); results in {session.out_dir}")

# %%
if INTERACTIVE:
    from cookbook import ui

    display(ui.bench_panel(RECIPE, session.endpoint.base_url, OUT_DIR, HARDWARE, OUTPUT_TOKENS))
    ui.stop_run_all()  # Run All ends here: the cells below run the suite headless, the panel does it here

# %% [markdown]
# ## The Performance table

# %%
from cookbook import bench, plots, roofline

open_loop = bench.OpenLoopConfig(rates=RATES, requests=RATE_REQUESTS, goodput=GOODPUT,
                                 dataset=bench.DatasetConfig(input_len=RATE_INPUT_LEN, output_len=RATE_OUTPUT_LEN))
config = bench.BenchConfig(output_tokens=OUTPUT_TOKENS, streams=STREAMS, long_lengths=LONG_LENGTHS,
                           long_depths=LONG_DEPTHS, sweep_levels=SWEEP_LEVELS, open_loop=open_loop)
measured_cold = None
if COLD_FROM_NEEDLES and "cold" in WORKLOADS:
    measured_cold = bench.needle_cold_runs(session.part_file("needles"), session.endpoint)
    print(measured_cold.note)
results = bench.run_performance_table(session.endpoint, session.recipe, config, session.hardware, WORKLOADS,
                                      measured_cold=measured_cold)
display(Markdown(results.performance_note))
report.figures_frame(results)

# %% [markdown]
# The detail behind it: requests, failures and latency percentiles per figure (ms; end to end in s).

# %%
bench.detail_frame(results)

# %% [markdown]
# ## Throughput and latency against concurrency

# %%
sweep = bench.sweep_frame(results)
title = f"{results.model} on {results.hardware.description}"
session.show_figure(plots.throughput_figure(sweep, title), "throughput") if not sweep.empty else "no sweep in WORKLOADS"

# %%
session.show_figure(plots.latency_figure(sweep, title), "latency") if not sweep.empty else "no sweep in WORKLOADS"

# %% [markdown]
# ## Per request: distributions and outliers
#
# Every request's time to first token and every gap between two tokens, per figure and sweep level (warm-up not
# included). A graph recompile or a stall hides in a mean; here it is a red diamond above the dashed fence, counted:
# an outlier lies above Q3 + 3 x IQR and above twice the median (`bench.stats.OUTLIER_RULE`).

# %%
session.show_figure(plots.latency_distribution_figure(results), "latency_distribution")

# %% [markdown]
# ## Throughput against latency
#
# The sweep as a curve: aggregate tokens/s against TTFT and inter-token latency (p50 and p99), each point labelled
# with its stream count. Where the curve turns flat, more streams buy latency and no throughput.

# %%
session.show_figure(plots.throughput_latency_figure(sweep, title), "throughput_latency") if not sweep.empty else "no sweep in WORKLOADS"

# %% [markdown]
# ## Open loop: latency and goodput against offered load
#
# Requests sent at each offered rate whatever the answers before them do (Poisson arrivals, seeded), as
# `vllm bench serve --request-rate` sends them. Left: TTFT and TPOT as the load rises; right: the achieved rate
# (completions per second) against the offered one, and goodput, the requests per second that met every objective
# in `GOODPUT`. Where the achieved rate leaves the diagonal the server has saturated; the client's own overhead at
# each rate (its share of a core, how late requests left) is in the table.

# %%
open_loop_rows = bench.open_loop_frame(results)
figure = results.figure("open-loop")
if figure is not None:
    display(Markdown(f"**{figure.result}** ({figure.measured_as})"))
    display(open_loop_rows[["offered_rate", "achieved_rate", "request_throughput", "request_goodput",
                            "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
                            "failed", "send_lag_ms_p99", "client_core_share", "saturated"]])
    session.show_figure(plots.open_loop_curve_figure(open_loop_rows, f"Latency and goodput against offered load: {title}"), "open_loop")
else:
    print("no rate in WORKLOADS")

# %% [markdown]
# ## TTFT against prompt length (cold prompts)
#
# Each cold prompt (a fresh `cache_salt`) at its length, the first cold prefill (the warm-up, which may compile)
# apart, and the mean prefill rate as a line. Cold figures read from the needle cells have no first-token time: their
# points are the time to the whole answer, drawn apart.

# %%
session.show_figure(plots.ttft_prompt_length_figure(results), "ttft_prompt_length")

# %% [markdown]
# ## KV-cache usage over the run
#
# The server's KV-cache usage gauge read from `/metrics` while the workloads ran, each workload shaded (warm-ups
# hatched); the figure says so when the server exposes no such gauge.

# %%
session.show_figure(plots.kv_cache_figure(results), "kv_cache")

# %% [markdown]
# ## The roofline
#
# Bytes a decode step must read at each batch (for MoE: the expected distinct experts touched), the hardware's
# bandwidth, and the measured fraction of that bound (MBU).

# %%
rows = roofline.roofline_rows(session.recipe, results.performance, results.hardware)
print(roofline.verdict(rows, session.recipe))
for row in rows:
    print(row.line())
facts = roofline.hardware_facts(results.hardware, session.recipe)
session.show_figure(plots.roofline_figure(rows, session.recipe, facts), "roofline")

# %%
session.write_part("throughput", results)

# %%
if not INTERACTIVE:  # interactive: a server this notebook launched runs until the kernel stops
    session.close()  # stops the server only if this notebook launched it
