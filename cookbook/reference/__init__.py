"""Ground truth for the served numerics: a reference forward pass of the same weights, from one of three sources.

The suite's other probes compare a server with itself; a server that is wrong the same way every time (a wrong RoPE
base, a wrong sliding window, a KV cache dtype the model was not made for) passes them. The numerics oracle
(`cookbook.checks.oracle`) compares the served logprobs with a reference instead. A reference is one of:

1. **computed here**: a transformers forward pass in the image's own environment (`_reference_forward.py`, run by
   the image's Python as a long-lived subprocess speaking JSON lines), on CPU, in fp32, on the recipe's local
   checkpoint. No per-model code: whatever architecture the checkpoint's config names.
2. **a golden file** in the recipe's folder (`reference/golden.json`): prompts, token ids, top-k logprobs of the
   prompt and of the greedy continuation, and how, where, on what and when it was produced. `cookbook reference
   record` writes it once, from (1) or from a trusted server; this is how a Gaudi recipe gets ground truth.
3. **another server** given by URL (a trusted image).

Every reference says which it is in `source`, a sentence a reader understands; the check writes it into the results.
The cookbook's own environment never imports torch or vLLM: (1) runs in the image's environment.

The package is split by job: `_types` (what a reference returns), `_computed` (the forward-pass subprocess and the
registry `COMPUTED`, whose `close_all()` ends them), `_golden`, `_server`, `_select` (which reference a check gets),
`_prompts` (the prompt set), `_record` (`cookbook reference record`); a flip is judged by the probe kit's one rule (`cookbook.checks.kit.departure`).
"""
from __future__ import annotations

from ._computed import (
    COMPUTED,
    FORWARD_SCRIPT,
    LOAD_TIMEOUT_S,
    SCORE_BASE_TIMEOUT_S,
    SCORE_SECONDS_PER_TOKEN,
    ComputedReference,
    ComputedReferences,
)
from ._golden import GOLDEN_DIR, GOLDEN_FILE, GOLDEN_FORMAT, GoldenPrompt, GoldenReference, golden_path
from ._prompts import SHORT_PROMPTS, Layout, OraclePrompt, build_prompts, recorded_positions
from ._record import checkpoint_facts, record, record_golden, record_layout
from ._select import (
    NO_REFERENCE,
    FallbackReference,
    ReferenceRequest,
    block_size_from_metrics,
    checkpoint_config,
    local_checkpoint,
    reference_for,
    reference_for_any_prompt,
    served_checkpoint,
)
from ._server import Served, ServerReference, complete_with_logprobs, completions_body
from ._types import Reference, ReferenceError, RefPosition, RefScore

__all__ = [
    "COMPUTED",
    "FORWARD_SCRIPT",
    "GOLDEN_DIR",
    "GOLDEN_FILE",
    "GOLDEN_FORMAT",
    "LOAD_TIMEOUT_S",
    "NO_REFERENCE",
    "SCORE_BASE_TIMEOUT_S",
    "SCORE_SECONDS_PER_TOKEN",
    "SHORT_PROMPTS",
    "ComputedReference",
    "ComputedReferences",
    "FallbackReference",
    "GoldenPrompt",
    "GoldenReference",
    "Layout",
    "OraclePrompt",
    "RefPosition",
    "RefScore",
    "Reference",
    "ReferenceError",
    "ReferenceRequest",
    "Served",
    "ServerReference",
    "block_size_from_metrics",
    "build_prompts",
    "checkpoint_config",
    "checkpoint_facts",
    "complete_with_logprobs",
    "completions_body",
    "golden_path",
    "local_checkpoint",
    "record",
    "record_golden",
    "record_layout",
    "recorded_positions",
    "reference_for",
    "reference_for_any_prompt",
    "served_checkpoint",
]
