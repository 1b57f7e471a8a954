"""Reproducer for structured-output-rows: the real `HPUModelRunner.sample_tokens` on a mixed structured-output step.

A step with one decode (D0) and one prompt (P0), both under a grammar. `sample_tokens` joins the logits decodes first
(`logits_decode + logits_prompt`), applies the grammar bitmask by batch index (decode rows first: correct), then
samples with `_run_sampling(..., pd_info.prompt_req_ids + pd_info.decode_req_ids, ...)`: the sampling metadata is
built prompt first, so each logits row is sampled with the other request's parameters (temperature, top-k/top-p,
generator, output history for penalties).

What runs is the real b059f9c code from `sample_tokens` through `_ensure_decodes_first`, `_get_prompts_and_decodes`,
`apply_grammar_bitmask` (xgrammar's CPU kernel), `_run_sampling`, `_prepare_sampling` and the real vllm_gaudi
`InputBatch.make_selective_sampling_metadata`, against vLLM 0.26.0's `Sampler`. Test doubles, only where a Gaudi card
or a model is needed: `_prepare_inputs` (returns the decode and prefill batches' shapes), `_execute_model_generic`
(returns fixed logits instead of running a model), `maybe_setup_kv_connector` (no connector), and the sampler is the
real vLLM `Sampler` wrapped to record its inputs and stop the step there (what follows is output bookkeeping). The
step is one where the batch did not change (the sampling tensors refreshed earlier, as `_update_states` does), so no
host-to-HPU copy is needed. Prints one JSON object as its last line.
"""
import contextlib
import json
import types

import numpy as np
import torch
from vllm.config import CompilationConfig, ParallelConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, GrammarOutput, SchedulerOutput
from vllm.v1.sample.sampler import Sampler

from vllm_gaudi.v1.worker import hpu_model_runner as hmr
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch

VOCAB = 32
BLOCK = 128
# Each request's grammar allows a distinct set of tokens, so a masked row shows whose mask it got.
ALLOWED = {"D0": [3, 4, 5], "P0": [20, 21, 22]}
TEMPERATURE = {"D0": 0.5, "P0": 0.9}
OUTPUT = {"D0": [11, 12], "P0": []}


class _Stop(Exception):
    pass


class _RecordingSampler:
    """vLLM 0.26.0's own Sampler; records what it was given and the result, then ends the step."""

    def __init__(self):
        self.sampler = Sampler()
        self.calls = []

    def __call__(self, logits, sampling_metadata):
        out = self.sampler(logits=logits.clone(), sampling_metadata=sampling_metadata)
        self.calls.append((logits.clone(), sampling_metadata, out))
        raise _Stop


class _Profiler:
    enabled = False

    def record_event(self, *args, **kwargs):
        return contextlib.nullcontext()

    def get_timestamp_us(self):
        return 0

    def start(self, *args):
        pass

    def end(self):
        pass


class _Runner(hmr.HPUModelRunner):
    """The real runner class; only the model/device steps are replaced (see the module docstring)."""

    def _prepare_inputs(self, scheduler_output, num_prefills, num_decodes, warmup_mode=False):
        self.prepared = (num_prefills, num_decodes)
        prefill = hmr.PrefillInputData(request_ids=[["P0"]], prompt_lens=[[4]], token_ids=[torch.zeros((1, 4),
                                                                                                       dtype=torch.long)],
                                       position_ids=[torch.zeros((1, 4), dtype=torch.long)], attn_metadata=[None],
                                       logits_indices=[torch.tensor([3])], logits_requests=[["P0"]])
        decode = hmr.DecodeInputData(num_decodes=1, token_ids=torch.zeros((1, 1), dtype=torch.long),
                                     position_ids=torch.zeros((1, 1), dtype=torch.long), attn_metadata=None,
                                     logits_indices=torch.tensor([0]))
        return (prefill, None), (decode, None)

    def _execute_model_generic(self, token_ids, position_ids, attn_metadata, logits_indices, kv_caches, *args,
                               **kwargs):
        # Flat logits (every token equally likely): what is left after masking shows whose grammar mask the row got.
        logits = torch.zeros((token_ids.shape[0], VOCAB), dtype=torch.float32)
        hidden = torch.zeros((*token_ids.shape, 8), dtype=torch.float32)  # [batch, seq, hidden] as the model returns
        return hidden, None, hidden[:, -1], logits

    def _get_model_mm_inputs(self, *args, **kwargs):
        return None, None

    def maybe_setup_kv_connector(self, scheduler_output):
        pass


def state(req_id, prompt, computed, output):
    params = SamplingParams(temperature=TEMPERATURE[req_id], max_tokens=16)
    return CachedRequestState(req_id=req_id, prompt_token_ids=prompt, mm_features=[], sampling_params=params,
                              generator=None, block_ids=[[1 + len(prompt) % 7]], num_computed_tokens=computed,
                              output_token_ids=output)


def main() -> None:
    batch = InputBatch(max_num_reqs=4, max_model_len=1024, max_num_batched_tokens=1024, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=VOCAB, block_sizes=[BLOCK], kernel_block_sizes=[BLOCK])
    d0 = state("D0", [1, 2, 3, 4, 5, 6], 7, list(OUTPUT["D0"]))  # decoding its 3rd token
    p0 = state("P0", [9, 8, 7, 6, 5, 4, 3, 2], 4, [])  # second chunk of its prompt (4 of 8 computed)
    requests = {}
    for req in (d0, p0):
        batch.add_request(req)
        requests[req.req_id] = req
    batch.refresh_sampling_metadata()  # as `_update_states` did when the batch last changed

    sched = SchedulerOutput(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData.make_empty(),
                            num_scheduled_tokens={"D0": 1, "P0": 4}, total_num_scheduled_tokens=5,
                            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, num_common_prefix_blocks=[0],
                            finished_req_ids=set(), free_encoder_mm_hashes=[], has_structured_output_requests=True)
    # The scheduler's bitmask, one row per structured request in `structured_output_request_ids` order.
    order = ["P0", "D0"]
    bitmask = np.zeros((len(order), 1), dtype=np.int32)
    for row, rid in enumerate(order):
        bitmask[row, 0] = np.int32(np.uint32(sum(1 << t for t in ALLOWED[rid])).view(np.int32))
    grammar = GrammarOutput(structured_output_request_ids=order, grammar_bitmask=bitmask)

    runner = object.__new__(_Runner)
    sampler = _RecordingSampler()
    runner.__dict__.update(
        scheduler_output=sched, warmup_mode=False, batch_changed=False, input_batch=batch, requests=requests,
        vllm_config=types.SimpleNamespace(speculative_config=None, parallel_config=ParallelConfig(),
                                          compilation_config=CompilationConfig()),
        use_async_scheduling=False, profiler=_Profiler(), is_driver_worker=False, lora_config=None,
        use_aux_hidden_state_outputs=False, kv_caches=[], sampler=sampler, device=torch.device("cpu"))
    try:
        runner.sample_tokens(grammar)
    except _Stop:
        pass
    assert len(sampler.calls) == 1, f"expected one structured-output sampling call, got {len(sampler.calls)}"
    logits, meta, out = sampler.calls[0]

    row_reqs = list(batch.req_ids)  # logits rows: decodes first, in batch order
    rows = []
    for i, rid in enumerate(row_reqs):
        finite = torch.isfinite(logits[i]).nonzero().flatten().tolist()
        mask_of = next((r for r, toks in ALLOWED.items() if toks == finite), f"none ({finite})")
        temp = float(meta.temperature[i])
        params_of = next((r for r, t in TEMPERATURE.items() if abs(t - temp) < 1e-6), f"none ({temp})")
        history_of = next((r for r, o in OUTPUT.items() if o == list(meta.output_token_ids[i])), "none")
        rows.append({"row": i, "request": rid, "grammar_mask_of": mask_of, "sampling_params_of": params_of,
                     "output_history_of": history_of, "sampled": out.sampled_token_ids[i].tolist()})
    fixed = all(r["grammar_mask_of"] == r["sampling_params_of"] == r["output_history_of"] == r["request"]
                for r in rows)
    symptom = "; ".join(f"logits row {r['row']} ({r['request']}): grammar mask of {r['grammar_mask_of']}, "
                        f"sampling params of {r['sampling_params_of']}" for r in rows)
    print(json.dumps({"fixed": fixed, "symptom": symptom, "rows": rows, "steps": runner.prepared}))


if __name__ == "__main__":
    main()
