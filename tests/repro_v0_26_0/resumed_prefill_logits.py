"""Reproducer for the v0.26.0 fix `resumed-prefill-logits` (run in the simulated image by `SimImage.repro`).

A request preempted after emitting output tokens is resumed by the scheduler as a recompute of its prompt plus those
outputs, from `num_computed_tokens` = the prefix-cache hit. The runner re-adds it with the real b059f9c
`InputBatch.add_request` (vllm_gaudi/v1/worker/hpu_input_batch.py), which counts the earlier outputs into
`num_prompt_tokens` only when `num_computed_tokens == 0`. The runner's real `_extract_prefill_batch_contents`
(hpu_model_runner.py) then asks for `computed + scheduled - num_prompt_tokens + 1` logits (capped to the scheduled
tokens), and `sample_tokens` appends one sampled token per logit to the request's output: with a prefix hit it
samples at every recomputed output position, so the generated tail repeats.

Each case adds a real `CachedRequestState` (real `SamplingParams`) to a real `InputBatch` and runs the runner's real
`_is_prompt` (with a real vLLM `SchedulerOutput`) and `_extract_prefill_batch_contents` on a runner made with
`object.__new__` (attributes set: the input batch, block size, no async scheduling / structured output, no mamba
layers, `get_dp_padding` as the runner builds it for one DP rank; `_can_merge_prefill_contents` answers False, as
it does for a request with history). The cases: a resumed request whose prefix hit ends inside the prompt, one whose
hit reaches into the earlier outputs, the first chunk of a chunked recompute (no logits may be produced), and two
controls that pristine handles right and the payload must keep: a resumed request with no prefix hit, and a running
decode re-added after a step without being scheduled (it stays a decode).
"""
from __future__ import annotations

import functools
import json
import os

os.environ.setdefault("VLLM_PLUGINS", "")

import torch  # noqa: E402

import vllm_gaudi.v1.worker.hpu_model_runner as hmr  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

BLOCK = 4
PROMPT = list(range(100, 110))  # 10 prompt tokens

# name: (output tokens emitted before preemption, num_computed_tokens at resume, scheduled tokens, expect_prompt,
#        expected logits positions within the scheduled tokens)
CASES = {
    "prefix hit inside the prompt": (5, 8, 7, True, [6]),
    "prefix hit into the earlier outputs": (6, 12, 4, True, [3]),
    "first chunk of a chunked recompute": (5, 8, 4, True, []),
    "control: no prefix hit": (5, 0, 15, True, [14]),
    "control: running decode re-added": (5, 14, 1, False, None),
}


def _runner(batch: InputBatch):
    runner = object.__new__(hmr.HPUModelRunner)
    runner.input_batch = batch
    runner.attn_block_size = BLOCK
    runner.num_mamba_like_layers = 0
    runner.use_async_scheduling = False
    runner.use_structured_output = False
    runner.get_dp_padding = functools.partial(hmr.get_dp_padding, dp_size=1, dp_rank=0)
    runner._can_merge_prefill_contents = lambda lhs, rhs: False
    return runner


def run_case(num_out: int, computed: int, scheduled: int) -> dict:
    batch = InputBatch(max_num_reqs=2, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=1000, block_sizes=[BLOCK], kernel_block_sizes=[BLOCK])
    outputs = list(range(500, 500 + num_out))
    state = CachedRequestState(req_id="r", prompt_token_ids=list(PROMPT), mm_features=[],
                               sampling_params=SamplingParams(temperature=0.0), generator=None,
                               block_ids=[list(range(1, 17))], num_computed_tokens=computed,
                               output_token_ids=outputs)
    assert computed + scheduled <= len(PROMPT) + num_out, "harness: the scheduler schedules no more than the tokens"
    idx = batch.add_request(state)
    runner = _runner(batch)
    sched = SchedulerOutput.make_empty()
    sched.num_scheduled_tokens = {"r": scheduled}
    sched.total_num_scheduled_tokens = scheduled
    is_prompt = runner._is_prompt(idx, sched)
    positions = None
    if is_prompt:
        contents, _ = runner._extract_prefill_batch_contents(1, 0, [scheduled])
        positions = [p for c in contents for lp in c.logits_positions for p in lp]
    return {"num_prompt_tokens": int(batch.num_prompt_tokens[idx]), "is_prompt": is_prompt,
            "logits_positions": positions}


def main() -> None:
    results, wrong = {}, []
    for name, (num_out, computed, scheduled, expect_prompt, expect_pos) in CASES.items():
        got = run_case(num_out, computed, scheduled)
        results[name] = got
        if got["is_prompt"] != expect_prompt or got["logits_positions"] != expect_pos:
            wrong.append(f"{name} ({len(PROMPT)} prompt + {num_out} earlier output tokens, "
                         f"num_computed_tokens={computed}, {scheduled} scheduled): "
                         f"num_prompt_tokens={got['num_prompt_tokens']}, "
                         f"{'prefill' if got['is_prompt'] else 'decode'} sampled at positions "
                         f"{got['logits_positions']} (expected {'prefill' if expect_prompt else 'decode'}"
                         f"{'' if expect_pos is None else f' at {expect_pos}'})")
    if wrong:
        symptom = "resumed prefill sampled at recomputed positions: " + "; ".join(wrong)
    else:
        symptom = "each resumed prefill samples once, at its last position (or not at all mid-chunk)"
    print(json.dumps({"fixed": not wrong, "symptom": symptom, "cases": results}))


if __name__ == "__main__":
    main()
