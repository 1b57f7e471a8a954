"""Reproducers of four v0.26.0 fixes outside the worker's batch code, on the simulated vllm-gaudi v0.26.0 image
(tests/gaudi_sim.py): async-discard-counter (HPU async scheduler), rank-exception-fatal (a hook from hpu_worker.py on
vLLM's worker busy loop), gather-logprobs-int32 and logprobs-decode-guard (patches.py). Each script in
tests/repro_v0_26_0/ imports the real vllm_gaudi module and drives vLLM 0.26.0's own classes.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.sim_image


def test_async_discard_counter(sim_image, patched_site) -> None:
    """A real `HPUAsyncScheduler` next to vLLM's own `AsyncScheduler`, same steps: prefill, a decode frame in flight,
    `reset_prefix_cache(reset_running_requests=True)` (sets `async_tokens_to_discard` to 1), the stale frame back, the
    resumed prefill, one more decode.

    Pristine b059f9c: `AttributeError: 'Request' object has no attribute 'discard_latest_async_tokens'` when the stale
    frame returns. With the payload: no exception, and after every step the request (output tokens, counter,
    placeholders, computed tokens, status) equals vLLM's: the stale frame is dropped and decrements the counter, the
    resumed prefill's token is kept (a guard that only skipped the read would drop it, and the trace shows it).
    """
    pristine = sim_image.repro("async-discard-counter")
    assert not pristine["fixed"], pristine
    assert "AttributeError" in pristine["symptom"] and "discard_latest_async_tokens" in pristine["symptom"], pristine

    patched = sim_image.repro("async-discard-counter", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["mismatches"] == [] and patched["hpu"] == patched["reference"], patched
    steps = dict(patched["hpu"])
    assert steps["preempted"]["async_tokens_to_discard"] == 1, steps
    assert steps["stale frame returned"]["async_tokens_to_discard"] == 0, steps
    assert steps["stale frame returned"]["output"] == [7001], steps
    assert steps["decode done"]["output"] == [7001, 7003, 7004], steps
    assert steps["decode done"]["num_output_placeholders"] == 0, steps


def test_rank_exception_fatal(sim_image, patched_site) -> None:
    """vLLM's `WorkerProc.worker_busy_loop` on a real shared-memory `MessageQueue` and `WorkerWrapperBase`, after
    importing vllm_gaudi/v1/worker/hpu_worker.py (as every worker process does); `sample_tokens(1)` fails.

    Pristine: on rank 1 with output_rank 0 the exception is logged, nothing reaches the executor, and the rank runs
    `sample_tokens(2)`: out of step. With the payload the loop raises a RuntimeError naming the rank and the device
    error (worker_main then
    logs "WorkerProc failed." and the process exits, which the executor's monitor turns into an engine shutdown) and
    runs no later step; on the output rank, and for a call every rank replies to, the exception still goes to
    `handle_output` and the loop goes on, as upstream.
    """
    pristine = sim_image.repro("rank-exception-fatal")
    assert not pristine["fixed"], pristine
    assert "swallowed the exception" in pristine["symptom"] and "sample_tokens(2)" in pristine["symptom"], pristine
    assert pristine["replying_ranks_unchanged"], pristine

    patched = sim_image.repro("rank-exception-fatal", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["non_output_rank"]["ran"] == ["sample_tokens(1)"], patched
    loop = patched["non_output_rank"]["loop"]
    assert loop.startswith("raised RuntimeError: rank 1 failed a call another rank replies to"), patched
    assert "RuntimeError('device error in step 1')" in loop, patched
    assert patched["replying_ranks_unchanged"], patched
    assert patched["output_rank"] == pristine["output_rank"], patched
    assert patched["all_ranks_reply"] == pristine["all_ranks_reply"], patched


def test_gather_logprobs_int32(sim_image, patched_site) -> None:
    """Contract test (gaudi-only bug: the int32 cast corrupts ids in lazy mode on a Gaudi card, which a CPU cannot
    show). The real `_hpu_gather_logprobs`, installed as `Sampler.gather_logprobs` by `patches.apply()` and
    `load_general_plugins()`, on logprobs over a 151,936-token vocabulary whose top ids sit above 2**17.

    Pristine: the ids come back int32. With the payload they are int64 and, on the device tensor and after
    `tolists()` (what reaches the host), exactly the sampled ids and torch.topk's indices; logprobs and ranks as
    vLLM's sampler defines them.
    """
    pristine = sim_image.repro("gather-logprobs-int32")
    assert pristine["installed"], pristine
    assert not pristine["fixed"] and "dtype torch.int32" in pristine["symptom"], pristine

    patched = sim_image.repro("gather-logprobs-int32", overlay=patched_site)
    assert patched["fixed"], patched
    assert patched["installed"] and patched["dtype"] == "torch.int64", patched
    assert patched["ids_exact"] and patched["host_ids_exact"], patched
    assert patched["logprobs_exact"] and patched["ranks_exact"], patched
    assert patched["max_id"] == 151_935, patched


def test_logprobs_decode_guard(sim_image, patched_site) -> None:
    """vLLM's real `OutputProcessor` with the SmolLM2 tokenizer, after `patches.apply()` and `load_general_plugins()`
    (as in the API-server process): logprob ids -1, 2**32 + 5, -3 (prompt logprobs) and -7 (the sampled slot), then
    a partial-UTF-8 token that vLLM re-decodes with the preceding sampled ids (holding -7) as context.

    Pristine: `OverflowError: number too small to fit in target type` at the first output (it kills
    `AsyncLLM.output_handler`, so the server stops serving). With the payload: no exception, each bad id reads
    `<bad token id N>`, every good id (and the partial-byte token) has the text vLLM's own detokenizing gives it.
    """
    pristine = sim_image.repro("logprobs-decode-guard")
    assert not pristine["fixed"], pristine
    assert "step 1: OverflowError: number too small to fit in target type" in pristine["symptom"], pristine

    patched = sim_image.repro("logprobs-decode-guard", overlay=patched_site)
    assert patched["fixed"], patched
    for bad in (-1, 2**32 + 5, -3, -7):
        assert patched["texts"][str(bad)] == [f"<bad token id {bad}>"], patched
    assert patched["texts"]["28"] == [","], patched

