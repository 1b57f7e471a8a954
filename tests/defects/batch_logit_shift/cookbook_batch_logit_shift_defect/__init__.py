"""A DELIBERATE TEST DEFECT, a vLLM general plugin: in a step that samples more than one sequence, each sequence's
second-ranked token has its logit raised by DELTA nats; a step with one sequence is untouched.

It stands for the engine bug the engine-states probes exist for (a batched kernel that moves one token's logits by
more than the dtype's noise, while every request run alone is exact), served by the real engine: vLLM loads it in
every process from the `vllm.general_plugins` entry point of the `*.dist-info` beside this package, once this
folder is on PYTHONPATH and VLLM_PLUGINS names `cookbook_batch_logit_shift_defect`. It replaces the model's
LogitsProcessor through vLLM's own out-of-tree layer registry, so the shifted logits are the ones the sampler picks
from and computes the returned (raw) logprobs from. Prompt logprobs (one request's prompt positions, computed apart)
are left alone. DELTA: COOKBOOK_DEFECT_BATCH_LOGIT_DELTA, default 2.0. Only tests/test_batch_defect.py uses it.
"""
from __future__ import annotations

import os
import threading
from typing import Any

ENV_DELTA = "COOKBOOK_DEFECT_BATCH_LOGIT_DELTA"
DEFAULT_DELTA = 2.0

_state = threading.local()
_registered = False


def defect_delta() -> float:
    """The deliberate shift in nats, from the environment."""
    return float(os.environ.get(ENV_DELTA, DEFAULT_DELTA))


def register() -> None:
    """vLLM calls this in the API server, the engine core and the worker; the layer swap matters in the worker,
    before the model is built. Idempotent: vLLM may load general plugins more than once."""
    global _registered
    if _registered:
        return
    _registered = True

    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    delta = defect_delta()

    @LogitsProcessor.register_oot(name="LogitsProcessor")
    class BatchLogitShiftDefect(LogitsProcessor):
        """DELIBERATE TEST DEFECT: the stock LogitsProcessor, then +DELTA on each row's second-ranked token when the
        step's sampled positions are more than one sequence."""

        def forward(self, lm_head: Any, hidden_states: Any, embedding_bias: Any = None, skip_gather: bool = False) -> Any:
            logits = super().forward(lm_head, hidden_states, embedding_bias, skip_gather)
            if logits is None or logits.dim() != 2 or logits.shape[0] < 2 or getattr(_state, "prompt_logprobs", False):
                return logits
            second = logits.topk(2, dim=-1).indices[:, 1:]
            return logits.scatter_add(-1, second, logits.new_full(second.shape, delta))

    stock_prompt_logprobs = GPUModelRunner._get_prompt_logprobs_dict

    def prompt_logprobs_untouched(self: Any, *args: Any, **kwargs: Any) -> Any:
        """The prompt-logprobs path computes one request's prompt positions in one call: not a batch of sequences."""
        _state.prompt_logprobs = True
        try:
            return stock_prompt_logprobs(self, *args, **kwargs)
        finally:
            _state.prompt_logprobs = False

    GPUModelRunner._get_prompt_logprobs_dict = prompt_logprobs_untouched  # type: ignore[method-assign]
    print(f"cookbook_batch_logit_shift_defect: DELIBERATE TEST DEFECT active, +{delta:g} nats on the second-ranked "
          "token of every sequence in a step sampling more than one", flush=True)
