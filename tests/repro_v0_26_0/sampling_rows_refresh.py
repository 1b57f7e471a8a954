"""Reproducer for the v0.26.0 fix `sampling-rows-refresh` (run in the simulated image by `SimImage.repro`).

The real b059f9c `InputBatch` (vllm_gaudi/v1/worker/hpu_input_batch.py) keeps every sampling parameter in a CPU row
and a device row per batch slot. `make_selective_sampling_metadata(..., skip_copy=not batch_changed)` copies the CPU
rows of the sampled requests to the device only when the runner's `batch_changed` is set, and `_update_states` sets it
only when a request was added or removed (hpu_model_runner.py ~L1958). The runner reorders the batch after that, in
`sample_tokens`: `_ensure_decodes_first` and `ensure_multi_token_decodes_last` call `InputBatch.swap_states`, which
swaps the CPU rows only. Three steps, as the runner drives them:

1. step 1, two new requests (batch_changed True): `add_request` both, `refresh_sampling_metadata()` as `_update_states`
   does; `a` (a long prompt) gets a first chunk only and is not sampled; `b`'s whole prompt runs and `b` is sampled.
2. step 2 (batch_changed False): `b` now decodes, `a` finishes its prompt. The runner's real `_ensure_decodes_first`
   (on a runner made with `object.__new__`, with a real vLLM `SchedulerOutput`) swaps the two rows; then the decode
   (`b`) and the prefill (`a`) are sampled with skip_copy=True.
3. step 3 (batch_changed False): both decode; `b` gets a 3-token catch-up, so the real module-level
   `ensure_multi_token_decodes_last` swaps them back; `a` (decode) and `b` are sampled with skip_copy=True.
4. step 4 (batch_changed False, no reorder): both decode in one batch, skip_copy=True.
5. step 5 (batch_changed False): now `a` has a catch-up, `ensure_multi_token_decodes_last` swaps them again.
6. step 6 (batch_changed False, no reorder): both decode in one batch, skip_copy=True (this step reads the
   prompt-token cache that step 4 built, before step 5's swap).

Each sampled request's metadata rows (temperature, top_p, top_k, the three penalties, and the prompt-token rows the
penalties read) are compared with its own `SamplingParams` and prompt. Pristine, step 2 samples each request with the
other's parameters (the device rows were not copied after the swap), steps 3, 4 and 6 give each request the other's
prompt tokens (the prompt-token cache built before a swap is not invalidated by it), and step 5 both.

Hook: the input batch's `async_h2d_update` (vllm_gaudi/utils.py) is called as it is, with `device=` the destination
tensor's device (the CPU here) instead of its hard-coded "hpu" default, which does not exist off a Gaudi card.
"""
from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_PLUGINS", "")

import torch  # noqa: E402

import vllm_gaudi.v1.worker.hpu_input_batch as hib  # noqa: E402
import vllm_gaudi.v1.worker.hpu_model_runner as hmr  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

VOCAB = 128
BLOCK = 16
_real_h2d_update = hib.async_h2d_update


def _h2d_update_on_dest_device(source, dest, indices, device="hpu"):
    """The real vllm_gaudi.utils.async_h2d_update, on the destination's device (CPU here, "hpu" on a card)."""
    return _real_h2d_update(source, dest, indices, device=dest.device)


hib.async_h2d_update = _h2d_update_on_dest_device

PARAMS = {
    "a": SamplingParams(temperature=0.5, top_p=0.9, top_k=5, repetition_penalty=1.5, frequency_penalty=0.2),
    "b": SamplingParams(temperature=1.3, top_p=0.6, top_k=40, repetition_penalty=1.1, presence_penalty=0.7),
}
PROMPTS = {"a": list(range(10, 22)), "b": [90, 91, 92, 93]}


def _state(req_id: str) -> CachedRequestState:
    return CachedRequestState(req_id=req_id, prompt_token_ids=list(PROMPTS[req_id]), mm_features=[],
                              sampling_params=PARAMS[req_id], generator=None, block_ids=[[0]],
                              num_computed_tokens=0, output_token_ids=[])


def _sched(num_scheduled: dict[str, int]) -> SchedulerOutput:
    out = SchedulerOutput.make_empty()
    out.num_scheduled_tokens = dict(num_scheduled)
    out.total_num_scheduled_tokens = sum(num_scheduled.values())
    return out


def _check(step: str, batch: InputBatch, states: dict, req_ids: list[str], skip_copy: bool) -> list[str]:
    """Sample `req_ids` as `_prepare_sampling` does; list every metadata row that is not the request's own."""
    md = batch.make_selective_sampling_metadata([(r, states[r].output_token_ids) for r in req_ids],
                                                skip_copy=skip_copy)
    wrong = []
    for row, req_id in enumerate(req_ids):
        sp = PARAMS[req_id]
        own = {"temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k,
               "frequency_penalty": sp.frequency_penalty, "presence_penalty": sp.presence_penalty,
               "repetition_penalty": sp.repetition_penalty}
        got = {"temperature": md.temperature[row].item(), "top_p": md.top_p[row].item(),
               "top_k": md.top_k[row].item(), "frequency_penalty": md.frequency_penalties[row].item(),
               "presence_penalty": md.presence_penalties[row].item(),
               "repetition_penalty": md.repetition_penalties[row].item()}
        bad = {k: round(got[k], 4) for k in own if abs(got[k] - own[k]) > 1e-5}
        if bad:
            wrong.append(f"{step}: {req_id} sampled with {bad} (its own: { {k: own[k] for k in bad} })")
        prompt = md.prompt_token_ids[row].tolist()
        expect = PROMPTS[req_id] + [VOCAB] * (len(prompt) - len(PROMPTS[req_id]))
        if prompt != expect:
            wrong.append(f"{step}: {req_id} penalised with prompt_token_ids {[t for t in prompt if t != VOCAB]} "
                         f"(its own: {PROMPTS[req_id]})")
    return wrong


def main() -> None:
    batch = InputBatch(max_num_reqs=4, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=VOCAB, block_sizes=[BLOCK], kernel_block_sizes=[BLOCK])
    runner = object.__new__(hmr.HPUModelRunner)
    runner.input_batch = batch
    states = {r: _state(r) for r in ("a", "b")}
    wrong: list[str] = []

    # Step 1: both added (batch_changed True). `a` runs an 8-token chunk of its 12-token prompt (no logits).
    for r in ("a", "b"):
        batch.add_request(states[r])
    batch.refresh_sampling_metadata()
    wrong += _check("step 1", batch, states, ["b"], skip_copy=False)
    states["b"].output_token_ids.append(50)
    batch.num_computed_tokens_cpu[batch.req_id_to_index["a"]] = 8
    batch.num_computed_tokens_cpu[batch.req_id_to_index["b"]] = 4
    order_1 = list(batch.req_ids)

    # Step 2 (batch_changed False): `b` decodes, `a` prefills its last 4 tokens; the runner puts decodes first.
    runner._ensure_decodes_first(_sched({"a": 4, "b": 1}))
    order_2 = list(batch.req_ids)
    wrong += _check("step 2 decode", batch, states, ["b"], skip_copy=True)
    wrong += _check("step 2 prefill", batch, states, ["a"], skip_copy=True)
    states["a"].output_token_ids.append(60)
    states["b"].output_token_ids.append(51)
    batch.num_computed_tokens_cpu[batch.req_id_to_index["a"]] = 12
    batch.num_computed_tokens_cpu[batch.req_id_to_index["b"]] = 5

    # Step 3 (batch_changed False): both decode, `b` with a 3-token catch-up: multi-token decodes go last.
    hmr.ensure_multi_token_decodes_last(batch, {"a": 1, "b": 3})
    order_3 = list(batch.req_ids)
    wrong += _check("step 3 decode", batch, states, ["a"], skip_copy=True)
    wrong += _check("step 3 catch-up", batch, states, ["b"], skip_copy=True)
    states["a"].output_token_ids.append(61)
    states["b"].output_token_ids.extend([52, 53, 54])

    # Step 4 (batch_changed False, no reorder): both decode in one batch.
    wrong += _check("step 4 decode", batch, states, list(batch.req_ids), skip_copy=True)
    states["a"].output_token_ids.append(62)
    states["b"].output_token_ids.append(55)

    # Step 5 (batch_changed False): now `a` has a 3-token catch-up: the runner swaps `b` first again.
    hmr.ensure_multi_token_decodes_last(batch, {"a": 3, "b": 1})
    order_5 = list(batch.req_ids)
    wrong += _check("step 5 decode", batch, states, ["b"], skip_copy=True)
    wrong += _check("step 5 catch-up", batch, states, ["a"], skip_copy=True)
    states["a"].output_token_ids.extend([63, 64, 65])
    states["b"].output_token_ids.append(56)

    # Step 6 (batch_changed False, no reorder): both decode in one batch.
    wrong += _check("step 6 decode", batch, states, list(batch.req_ids), skip_copy=True)

    reordered = order_1 != order_2 and order_2 != order_3 and order_3 != order_5
    fixed = reordered and not wrong
    if not reordered:
        symptom = f"harness: the runner did not reorder the batch ({order_1} -> {order_2} -> {order_3} -> {order_5})"
    elif wrong:
        symptom = "stale sampling rows after a reorder: " + "; ".join(wrong)
    else:
        symptom = "every sampled request got its own sampling rows and prompt tokens after each reorder"
    print(json.dumps({"fixed": fixed, "symptom": symptom, "orders": [order_1, order_2, order_3, order_5],
                      "stale": wrong}))


if __name__ == "__main__":
    main()
