"""The decode roofline: how far a measured figure runs from what the hardware's memory bandwidth allows.

Decode is bound by reading weights: every step reads the non-expert weights once and, in a MoE layer, the distinct
experts that the batch's tokens route to. With E experts and k per token, a batch of B tokens touches
E * (1 - (1 - k/E)^B) distinct experts on average, so the bytes per step grow with the batch until every expert is
read. The bound is bandwidth / bytes per step (steps per second, each step yields B tokens); the measured fraction
of it is the memory-bandwidth utilisation (MBU). KV-cache reads are left out: short-prompt decode is dominated by
weights, and the bound stays a bound.

Hardware facts: Gaudi 2 and Gaudi 3 from their datasheets; the CPU this runs on is measured once (single-thread
read bandwidth, the model's share of a 2-vCPU machine) and cached, or declared through COOKBOOK_CPU_BANDWIDTH_GBS.
"""
from __future__ import annotations

import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field

from .image import cache_dir
from .recipes import ModelFacts, Recipe
from .results import Figure, Hardware

CPU_BANDWIDTH_ENV = "COOKBOOK_CPU_BANDWIDTH_GBS"
_READ_BYTES = 256 * 2**20  # far beyond any L3 cache
_READ_RUNS = 30
_READ_METHOD = f"numpy int64 max, 1 thread, best of {_READ_RUNS}, 256 MiB, thread CPU time"
_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


class HardwareFacts(BaseModel):
    """What the roofline needs of the hardware that produced a figure."""

    model_config = ConfigDict(frozen=True)

    kind: str = Field(description="gaudi2, gaudi3 or cpu")
    cards: int = Field(1, ge=1, description="Cards the weights are spread over (tensor parallel); 1 for the CPU")
    memory_gb: float | None = Field(None, description="Memory per card in GB (None for the CPU)")
    bandwidth_per_card: float = Field(gt=0, description="Bytes per second one card (or the CPU) can read")
    source: str = Field(description="Where the bandwidth comes from: datasheet, measured or declared")

    @property
    def bandwidth(self) -> float:
        """All cards together: with tensor parallelism each card reads its share of the weights at once."""
        return self.bandwidth_per_card * self.cards

    @property
    def label(self) -> str:
        if self.kind == "cpu":
            return f"CPU at {self.bandwidth_per_card / 1e9:.1f} GB/s ({self.source})"
        name = {"gaudi2": "Gaudi 2", "gaudi3": "Gaudi 3"}.get(self.kind, self.kind)
        return f"{self.cards}x {name} at {self.bandwidth_per_card / 1e12:.2f} TB/s per card ({self.source})"


GAUDI2 = HardwareFacts(kind="gaudi2", memory_gb=96, bandwidth_per_card=2.45e12, source="datasheet HBM2E")
GAUDI3 = HardwareFacts(kind="gaudi3", memory_gb=128, bandwidth_per_card=3.7e12, source="datasheet HBM2E")
_DATASHEETS = {"gaudi2": GAUDI2, "gaudi3": GAUDI3}


# ---------------------------------------------------------------------------------------------------------------
# The CPU: measured once, cached


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_read_bandwidth(nbytes: int = _READ_BYTES, runs: int = _READ_RUNS) -> float:
    """Single-thread read bandwidth in bytes/s: numpy's max over int64 (a vectorised pass that only reads),
    best of `runs`. One thread because vLLM's CPU build binds the model to one core; reads because decode reads
    weights. Each pass is timed by this thread's CPU time, not the wall clock: on a shared machine the scheduler
    parks the thread between slices, and a wall-clock pass taken at load 24 on 2 cores read 5.3 GB/s on a CPU that
    reads 36 (every decode figure then ran at an impossible 119% of it). Best-of, because a busy neighbour sharing
    the memory bus still makes a pass slower."""
    import numpy as np

    values = np.ones(nbytes // 8, dtype=np.int64)
    best = float("inf")
    for _ in range(runs):
        started = time.thread_time()
        values.max()
        best = min(best, max(time.thread_time() - started, 1e-9))
    return values.nbytes / best


def cpu_bandwidth(refresh: bool = False) -> tuple[float, str]:
    """(bytes/s, source) for this machine's CPU: declared in $COOKBOOK_CPU_BANDWIDTH_GBS, else measured once and
    cached per CPU model and method in the cache folder. A measurement taken while the machine is oversubscribed
    (1-minute load at or above its CPU count) is used but never cached: a busy neighbour on the other hyperthread
    halves what one thread reads, and a cached low figure would put every later decode figure above 100%."""
    declared = os.environ.get(CPU_BANDWIDTH_ENV)
    if declared:
        return float(declared) * 1e9, f"declared in {CPU_BANDWIDTH_ENV}"
    path = cache_dir() / "roofline" / "cpu-read-bandwidth.json"
    cpu = _cpu_model()
    if not refresh and path.exists():
        try:
            cached = json.loads(path.read_text())
            if cached.get("cpu") == cpu and cached.get("method") == _READ_METHOD:  # another method: measure again
                return float(cached["bytes_per_s"]), f"measured 1-thread read bandwidth, {cached['date']}"
        except (ValueError, KeyError):
            pass
    load = os.getloadavg()[0]
    value = measure_read_bandwidth()
    date = time.strftime("%Y-%m-%d")
    if load >= (os.cpu_count() or 1):  # oversubscribed: good for this run, not for every run after it
        return value, f"measured 1-thread read bandwidth, {date}, at load {load:.1f} (not cached)"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu, "bytes_per_s": value, "date": date, "method": _READ_METHOD, "load": round(load, 2)}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return value, f"measured 1-thread read bandwidth, {date}"


# ---------------------------------------------------------------------------------------------------------------
# Which hardware produced a figure


def _cards_in(description: str) -> int | None:
    """'4x Gaudi 2 (TP 4)' -> 4, 'four Gaudi 2 cards' -> 4, '2 cards' -> 2, 'Gaudi 3' -> None."""
    text = re.sub(r"gaudi\s*[0-9]", "gaudi", description, flags=re.I)  # the product's digit is not a count
    match = re.search(r"\b(\d+)\s*x\b", text) or re.search(r"\b(\d+)\s+(?:gaudi|cards?)\b", text, re.I)
    if match:
        return int(match.group(1))
    for word, number in _WORDS.items():
        if re.search(rf"\b{word}\s+(?:gaudi|cards?)\b", text, re.I):
            return number
    return None


def hardware_facts(hardware: Hardware | None, recipe: Recipe | None = None) -> HardwareFacts | None:
    """Facts for the hardware that produced the figures (a run's `hardware`); None when it is unknown, so a run
    on unstated hardware never gets a Gaudi roofline. Without `hardware`, the recipe's own (published figures)."""
    kind: str
    if hardware is None:
        if recipe is None:
            return None
        kind, cards = recipe.hardware.kind, recipe.hardware.cards
    else:
        kind = hardware.kind
        cards = _cards_in(hardware.description) or (
            recipe.hardware.cards if recipe is not None and recipe.hardware.kind == kind else 1
        )
    if kind in _DATASHEETS:
        return _DATASHEETS[kind].model_copy(update={"cards": cards})
    if kind == "cpu":
        value, source = cpu_bandwidth()
        return HardwareFacts(kind="cpu", bandwidth_per_card=value, source=source)
    return None


# ---------------------------------------------------------------------------------------------------------------
# Model arithmetic


def expert_split(model: ModelFacts) -> tuple[float, float]:
    """(non-expert params, routed-expert params). Active = non-expert + expert * k/E, total = non-expert + expert,
    so expert = (total - active) / (1 - k/E). Dense models (and k = E) are all non-expert."""
    experts, active = model.experts_total, model.experts_active
    if experts == 0 or active == 0 or active >= experts:
        return model.params_total, 0.0
    expert = min(model.params_total, (model.params_total - model.params_active) / (1 - active / experts))
    return model.params_total - expert, expert


def distinct_experts(experts: int, per_token: int, batch: int) -> float:
    """Expected distinct experts a batch of `batch` tokens touches in one MoE layer: E * (1 - (1 - k/E)^B)."""
    if experts == 0:
        return 0.0
    return experts * (1 - (1 - per_token / experts) ** batch)


def bytes_per_step(model: ModelFacts, batch: int) -> float:
    """Weight bytes one decode step must read at this batch: all non-expert weights, the touched experts."""
    non_expert, expert = expert_split(model)
    touched = 1.0 if model.experts_total == 0 else distinct_experts(model.experts_total, model.experts_active, batch) / model.experts_total
    return (non_expert + expert * touched) * model.bytes_per_weight


def all_weight_bytes(model: ModelFacts) -> float:
    return model.params_total * model.bytes_per_weight


# ---------------------------------------------------------------------------------------------------------------
# A figure against the roofline


class RooflineRow(BaseModel):
    """One decode figure against the bandwidth bound at its batch."""

    figure: str = Field(description="Figure name, e.g. n-streams or sweep@4")
    hardware: str = Field(description="The hardware facts used, e.g. '4x Gaudi 2 at 2.45 TB/s per card (datasheet)'")
    batch: int = Field(description="Sequences decoded together: min(streams, --max-num-seqs)")
    experts_total: int = 0
    experts_touched: float | None = Field(None, description="Expected distinct experts per MoE layer at this batch")
    bytes_per_step: float = Field(description="Weight bytes one step must read at this batch (the bound)")
    all_weight_bytes: float = Field(description="Every weight, every expert included")
    bound_steps_per_s: float
    bound_tokens_per_s: float
    measured_tokens_per_s: float = Field(description="Aggregate decode tokens/s: steps/s x batch")
    measured_steps_per_s: float
    rate_source: str = Field(description="Which measured rate: 'TPOT' (decode only) or 'end to end' (incl. TTFT)")
    mbu: float = Field(description="Measured bytes/s over the hardware's bytes/s, at this batch's bound")
    mbu_all_weights: float = Field(description="The same if every weight were read at every step")
    bytes_per_token_bound: float = Field(description="bytes_per_step / batch: what a token must cost at least")
    effective_bytes_per_token: float = Field(description="Bandwidth / measured tokens/s: what a token did cost")
    verdict: str = Field("", description="One line an engineer reads at a glance")

    def line(self) -> str:
        experts = (
            f", {self.experts_touched:.1f} of {self.experts_total} experts per MoE layer"
            if self.experts_touched is not None
            else ", dense"
        )
        return (
            f"{self.figure}: batch {self.batch}{experts}: bound {_gb(self.bytes_per_step)} per step = "
            f"{self.bound_tokens_per_s:,.0f} tokens/s; measured {self.measured_tokens_per_s:,.1f} tokens/s "
            f"({self.rate_source}), MBU {self.mbu:.1%}; {_gb(self.bytes_per_token_bound)}/token bound, "
            f"{_gb(self.effective_bytes_per_token)}/token effective. {self.verdict}"
        )


def _gb(value: float) -> str:
    return f"{value / 1e9:.2f} GB" if value >= 1e8 else f"{value / 1e6:.1f} MB"


def _batch_of(figure: Figure, recipe: Recipe) -> int | None:
    streams = figure.metrics.get("streams")
    if streams is None:
        if figure.name == "single-stream":
            streams = 1
        elif figure.name == "n-streams":
            streams = recipe.max_num_seqs
        else:
            return None
    return max(1, min(int(streams), recipe.max_num_seqs))


def _step_rate(figure: Figure, batch: int) -> tuple[float, str] | None:
    """Decode steps per second (each step gives every running stream one token): from TPOT when measured here,
    else from the end-to-end per-stream figure (the published ones), which includes TTFT."""
    m = figure.metrics
    tpot = m.get("tpot_ms_mean")
    if tpot:
        return 1000.0 / float(tpot), "TPOT"
    per_stream = m.get("per_stream_tokens_per_s")
    if per_stream:
        return float(per_stream), "end to end"
    aggregate = m.get("aggregate_tokens_per_s") or m.get("tokens_per_s")
    if aggregate:
        return float(aggregate) / batch, "end to end"
    return None


def roofline_for(recipe: Recipe, figure: Figure, hardware: Hardware | HardwareFacts | None = None) -> RooflineRow | None:
    """The roofline row of one decode figure (single-stream, n-streams, a sweep level); None for figures that are
    not decode (cold prompts) or when the hardware is unknown. `hardware`: what produced the figure (a run's
    `hardware`); None means the recipe's own, which is right for published figures only."""
    facts = hardware if isinstance(hardware, HardwareFacts) else hardware_facts(hardware, recipe)
    batch = _batch_of(figure, recipe)
    rate = _step_rate(figure, batch) if batch is not None else None
    if facts is None or batch is None or rate is None:
        return None
    model = recipe.model
    steps, source = rate
    tokens_per_s = steps * batch
    step_bytes = bytes_per_step(model, batch)
    every = all_weight_bytes(model)
    bound_steps = facts.bandwidth / step_bytes
    row = RooflineRow(
        figure=figure.name,
        hardware=facts.label,
        batch=batch,
        experts_total=model.experts_total,
        experts_touched=distinct_experts(model.experts_total, model.experts_active, batch) if model.experts_total else None,
        bytes_per_step=step_bytes,
        all_weight_bytes=every,
        bound_steps_per_s=bound_steps,
        bound_tokens_per_s=bound_steps * batch,
        measured_tokens_per_s=tokens_per_s,
        measured_steps_per_s=steps,
        rate_source=source,
        mbu=step_bytes * steps / facts.bandwidth,
        mbu_all_weights=every * steps / facts.bandwidth,
        bytes_per_token_bound=step_bytes / batch,
        effective_bytes_per_token=facts.bandwidth / tokens_per_s,
    )
    return row.model_copy(update={"verdict": _row_verdict(row, recipe)})


def _dtype(recipe: Recipe) -> str:
    return recipe.precision.dtype.upper()


def _row_verdict(row: RooflineRow, recipe: Recipe) -> str:
    if row.mbu >= 0.6:
        return f"Bandwidth bound: decode reads the {_gb(row.bytes_per_step)} it must at {row.mbu:.0%} of the bandwidth."
    if row.experts_touched is not None and 0.6 <= row.mbu_all_weights <= 1.0:
        return (
            f"The step time fits reading every {_dtype(recipe)} expert ({_gb(row.all_weight_bytes)}) at "
            f"{row.mbu_all_weights:.0%} of the bandwidth, not the {_gb(row.bytes_per_step)} the routed experts need."
        )
    if row.experts_touched is not None:
        return (
            f"Decode runs at {row.mbu:.1%} of the routed-expert bound ({row.mbu_all_weights:.0%} if every expert "
            f"were read at each step)."
        )
    return (
        f"Decode runs at {row.mbu:.1%} of the bandwidth bound: most of each step goes to something other than "
        f"reading weights (compute, host, launch overhead)."
    )


def _batch_verdict(low: RooflineRow, high: RooflineRow, recipe: Recipe) -> str | None:
    """Across batch sizes: does the step time follow the bytes the batch must read?"""
    time_ratio = low.measured_steps_per_s / high.measured_steps_per_s
    bytes_ratio = high.bytes_per_step / low.bytes_per_step
    span = f"from batch {low.batch} to {high.batch}"
    if time_ratio < 0.8:
        return (
            f"Step time x{time_ratio:.2f} {span}: shorter at the larger batch, so the smaller batch's figure was "
            f"slowed by something else (other requests on a shared server?)."
        )
    if low.experts_touched is not None and bytes_ratio >= 1.5:
        if time_ratio <= 1 + 0.25 * (bytes_ratio - 1):
            return (
                f"Step time x{time_ratio:.2f} {span} while the routed experts' bytes grow x{bytes_ratio:.1f}: a fixed "
                f"cost per step, as when decode reads every {_dtype(recipe)} expert at each step."
            )
        if time_ratio >= 1 + 0.5 * (bytes_ratio - 1):
            return (f"Step time x{time_ratio:.2f} {span} follows the routed experts' bytes (x{bytes_ratio:.1f}): "
                    "decode reads only the experts it routes to.")
        return (f"Step time x{time_ratio:.2f} {span} while the routed experts' bytes grow x{bytes_ratio:.1f}: "
                "between reading only the routed experts and reading them all.")
    if time_ratio >= 1.5:
        return f"Step time x{time_ratio:.2f} {span} with the same weight reads: per-token work (compute, host), not bandwidth, grows with the batch."
    if time_ratio <= 1.2:
        return f"Step time x{time_ratio:.2f} {span}: batching is nearly free, each step costs the same."
    return None


def roofline_rows(recipe: Recipe, figures: Iterable[Figure], hardware: Hardware | HardwareFacts | None = None) -> list[RooflineRow]:
    """Rows for every decode figure (sweep levels included), sorted by batch; a row above the smallest batch also
    says how its step time compares with the smallest batch's."""
    facts = hardware if isinstance(hardware, HardwareFacts) else hardware_facts(hardware, recipe)
    if facts is None:
        return []
    rows: list[RooflineRow] = []
    for figure in figures:
        if figure.name == "sweep":
            for level in figure.details.get("rows", []):
                sub = Figure(name=f"sweep@{level['streams']}", label="", result="", metrics=_numbers(level))
                row = roofline_for(recipe, sub, facts)
                if row is not None:
                    rows.append(row)
            continue
        row = roofline_for(recipe, figure, facts)
        if row is not None:
            rows.append(row)
    rows.sort(key=lambda r: (r.batch, r.figure))
    if rows:
        low = rows[0]
        for index, row in enumerate(rows):
            if row.batch > low.batch:
                extra = _batch_verdict(low, row, recipe)
                if extra:
                    rows[index] = row.model_copy(update={"verdict": f"{row.verdict} {extra}"})
    return rows


def _numbers(values: dict[str, object]) -> dict[str, float | int | None]:
    return {k: v for k, v in values.items() if isinstance(v, (int, float)) or v is None}


def verdict(rows: list[RooflineRow], recipe: Recipe) -> str:
    """One line for the model: the comparison across batch sizes when there is one, else the single row's."""
    if not rows:
        return "No roofline: the hardware that produced the figures is not known, or no decode figure was measured."
    low, high = rows[0], rows[-1]
    if high.batch > low.batch:
        extra = _batch_verdict(low, high, recipe)
        if extra:
            return extra
    return low.verdict
