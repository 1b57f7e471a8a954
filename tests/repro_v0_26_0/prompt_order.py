"""Reproducer for prompt-order: the real `HPUModelRunner._ensure_decodes_first` on a real persistent batch.

The scheduler schedules decodes D2, D3 (still running) and new prompts P0, P1 in that order; P1 shares P0's prefix, so
the scheduler gave P1 a prefix-cache hit on the block P0 writes in this very step. The runner's `_update_states` fills
the freed slots 0 and 1 with P0, P1 (smallest free index first), leaving the persistent batch [P0, P1, D2, D3]. The
runner then moves the decodes to the front with `_ensure_decodes_first`, and prefills run in the resulting batch order
(`_extract_prefill_batch_contents`), so P0 must stay ahead of P1. The pristine method swaps the first prompt with the
last decode and reverses the prompts ([D3, D2, P1, P0]): P1 then reads the block before P0 has written it.

Real objects: vllm_gaudi's `InputBatch` / `CachedRequestState` (add_request, remove_request and swap_states as the
runner calls them), vLLM 0.26.0's `SamplingParams`, `SchedulerOutput`, `NewRequestData`, `CachedRequestData`; the
runner is `object.__new__(HPUModelRunner)` with only the `input_batch` its `_is_prompt` / `_ensure_decodes_first`
read. Prints one JSON object as its last line.
"""
import json
import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402

from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch  # noqa: E402
from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner  # noqa: E402

BLOCK = 128


def state(req_id, prompt, computed, output, blocks):
    return CachedRequestState(req_id=req_id, prompt_token_ids=prompt, mm_features=[],
                              sampling_params=SamplingParams(temperature=0.0, max_tokens=8), generator=None,
                              block_ids=[blocks], num_computed_tokens=computed, output_token_ids=output)


def main() -> None:
    batch = InputBatch(max_num_reqs=8, max_model_len=4096, max_num_batched_tokens=4096, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=64, block_sizes=[BLOCK], kernel_block_sizes=[BLOCK])
    # Earlier steps: four decodes D0..D3 (prompt of 8 tokens computed, one output token each).
    for n in range(4):
        batch.add_request(state(f"D{n}", [n + 1] * 8, 8, [5], [10 + n]))
    # This step: D0 and D1 finished; the runner frees their slots, then adds the new prompts smallest slot first.
    freed = sorted((batch.remove_request("D0"), batch.remove_request("D1")), reverse=True)
    shared = [7] * BLOCK  # one full block of common prefix: P0 writes block 1, P1 hits it
    p0 = state("P0", shared + [1, 2, 3], 0, [], [1, 2])
    p1 = state("P1", shared + [4, 5, 6], BLOCK, [], [1, 3])
    new_reqs = []
    for req in (p0, p1):
        batch.add_request(req, freed.pop())
        new_reqs.append(NewRequestData(req_id=req.req_id, prompt_token_ids=req.prompt_token_ids, mm_features=[],
                                       sampling_params=req.sampling_params, pooling_params=None,
                                       block_ids=tuple(req.block_ids), num_computed_tokens=req.num_computed_tokens,
                                       lora_request=None))
    scheduler_order = ["D2", "D3", "P0", "P1"]
    num_scheduled = {"D2": 1, "D3": 1, "P0": len(p0.prompt_token_ids), "P1": len(p1.prompt_token_ids) - BLOCK}
    cached = CachedRequestData.make_empty()
    cached.req_ids = ["D2", "D3"]
    sched = SchedulerOutput(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                            num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=sum(num_scheduled.values()),
                            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, num_common_prefix_blocks=[1],
                            finished_req_ids={"D0", "D1"}, free_encoder_mm_hashes=[])
    before = list(batch.req_ids)

    runner = object.__new__(HPUModelRunner)
    runner.input_batch = batch
    runner._ensure_decodes_first(sched)
    after = list(batch.req_ids)

    # What the prefill path reads next: the prompts in batch order after the decodes, and each one's block table row.
    prompts = [r for r in after if r.startswith("P")]
    decodes = [r for r in after if r.startswith("D")]
    rows_ok = all(batch.block_table[0].get_cpu_tensor()[batch.req_id_to_index[r], :2].tolist() == blocks
                  for r, blocks in (("P0", [1, 2]), ("P1", [1, 3])))
    expected_prompts = [r for r in scheduler_order if r.startswith("P")]
    fixed = (after[:len(decodes)] == decodes and prompts == expected_prompts and rows_ok)
    symptom = (f"prefill order {prompts} (scheduler order {expected_prompts}): "
               + ("P1 reads the prefix block P0 writes in this step before P0 runs" if prompts != expected_prompts
                  else "P0 writes the shared block before P1 reads it"))
    print(json.dumps({"fixed": fixed, "symptom": symptom, "batch_before": before, "batch_after": after,
                      "prefill_order": prompts, "scheduler_order": scheduler_order, "block_rows_follow": rows_ok}))


if __name__ == "__main__":
    main()
