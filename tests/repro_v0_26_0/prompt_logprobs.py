"""Reproducer for the v0.26.0 fix `prompt-logprobs` (run in the simulated image by `SimImage.repro`).

The real b059f9c `HPUModelRunner` (vllm_gaudi/v1/worker/hpu_model_runner.py) computes prompt logprobs for one
prefill batch of a model in `flatten_input` (qwen3_5_moe and the other MoE models of extension/features.py), whose
forward returns FLAT hidden states, [batch * seq_len, hidden], instead of [batch, seq_len, hidden]:

1. the runner's own collection step of `sample_tokens` (the statements under "# Collect prefill hidden states for
   prompt logprobs." in the loaded module, read with `inspect.getsource` and executed as they are: pristine, the
   inline `non_flattened_hidden_states[i]` loop; with the payload, its call of `_collect_prompt_logprobs_hidden_states`),
   because `sample_tokens` as a whole drives the HPU forward and cannot run off a Gaudi card;
2. the runner's real `_get_prompt_logprobs_dict` and `_gather_prompt_logprobs_hpu`, on a runner made with
   `object.__new__` that holds a real vllm_gaudi `InputBatch` (requests added with real `SamplingParams(prompt_logprobs=5)`
   and `CachedRequestState`), vLLM 0.26.0's real `Sampler` and `SchedulerOutput`, and a stub model whose
   `compute_logits` is an lm_head matmul that records the rows of every logits tensor it returns.

Pristine, the first prompt_logprobs request raises (that exception kills the engine on a card). With the payload the
values are compared with a full-logits reference (the whole prompt's logits at once, vLLM's own
`Sampler.compute_logprobs`), and the largest logits tensor and the peak of torch's CPU allocations during the call
(torch.profiler memory events) show that the fp32 logits are bounded by chunk_rows x vocab, not tokens x vocab.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import textwrap
import traceback

os.environ.setdefault("VLLM_PROMPT_LOGPROBS_CHUNK_ROWS", "256")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import vllm_gaudi.v1.worker.hpu_model_runner as hmr  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.outputs import LogprobsTensors  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

HIDDEN, VOCAB, SEQ = 64, 16384, 2048          # a padded prefill bucket of 2 x 2048 tokens
PROMPT_LENS = {"req-a": 2000, "req-b": 1500}  # both ask for prompt_logprobs=5
NUM_LOGPROBS = 5
CHUNK_ROWS = int(os.environ["VLLM_PROMPT_LOGPROBS_CHUNK_ROWS"])


class StubModel:
    """Stands in for the model adapter: `compute_logits` is the lm_head matmul; it records each logits tensor's rows."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.logits_rows: list[int] = []

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden_states, self.weight)
        self.logits_rows.append(int(logits.shape[0]) if logits.dim() > 1 else 1)
        return logits


def collection_snippet() -> str:
    """The loaded module's own statements of `sample_tokens` that collect hidden states for prompt logprobs."""
    src = inspect.getsource(hmr.HPUModelRunner.sample_tokens).splitlines()
    start = next(i for i, line in enumerate(src) if "# Collect prefill hidden states for prompt logprobs." in line)
    end = next(i for i in range(start, len(src)) if "if self.use_aux_hidden_state_outputs:" in src[i])
    return textwrap.dedent("\n".join(src[start:end]))


def reference(logprobs: torch.Tensor, token_ids: torch.Tensor) -> LogprobsTensors:
    """[prompt token, top-k] ids and logprobs and the prompt token's rank, from whole-prompt logprobs."""
    topk_logprobs, topk_ids = torch.topk(logprobs, NUM_LOGPROBS, dim=-1)
    token_logprobs = logprobs.gather(-1, token_ids.unsqueeze(-1))
    ranks = (logprobs >= token_logprobs).sum(-1)
    return LogprobsTensors(torch.cat((token_ids.unsqueeze(-1), topk_ids), dim=1),
                           torch.cat((token_logprobs, topk_logprobs), dim=1), ranks)


def peak_cpu_bytes(prof) -> int:
    """Peak of live CPU bytes allocated during the profiled region: each op's own (self) allocations net of its frees,
    and the frees outside any op (`[memory]` events), summed in time order."""
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def measure(chunk_rows: int, flat: bool = True):
    """One prefill batch through the runner's collection step and `_get_prompt_logprobs_dict` (chunk_rows as given;
    the model's hidden states flat as in `flatten_input`, or [batch, seq, hidden] as the other models return them).

    Returns (the inputs, the result, the model's recorded logits rows, the peak CPU bytes of the call)."""
    os.environ["VLLM_PROMPT_LOGPROBS_CHUNK_ROWS"] = str(chunk_rows)
    torch.manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN) / HIDDEN**0.5
    model = StubModel(weight)

    batch = InputBatch(max_num_reqs=4, max_model_len=4096, max_num_batched_tokens=8192, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=VOCAB, block_sizes=[128], kernel_block_sizes=[128])
    requests, prompts = {}, {}
    for rid, n in PROMPT_LENS.items():
        prompts[rid] = torch.randint(0, VOCAB, (n, )).tolist()
        state = CachedRequestState(req_id=rid, prompt_token_ids=prompts[rid], mm_features=[],
                                   sampling_params=SamplingParams(max_tokens=4, prompt_logprobs=NUM_LOGPROBS),
                                   generator=None, block_ids=[[0]], num_computed_tokens=0, output_token_ids=[])
        requests[rid] = state
        batch.add_request(state)
    assert batch.num_prompt_logprobs == {rid: NUM_LOGPROBS for rid in PROMPT_LENS}, batch.num_prompt_logprobs

    runner = object.__new__(hmr.HPUModelRunner)
    runner.input_batch = batch
    runner.requests = requests
    runner.device = torch.device("cpu")
    runner.model = model
    runner.sampler = Sampler()

    sched = SchedulerOutput.make_empty()
    sched.num_scheduled_tokens = dict(PROMPT_LENS)
    sched.total_num_scheduled_tokens = sum(PROMPT_LENS.values())

    # The prefill batch as the runner's loop sees it: token_ids [batch, seq] (padded), and the model's flat output.
    req_id = list(PROMPT_LENS)
    token_ids = torch.zeros(len(req_id), SEQ, dtype=torch.long)
    for i, rid in enumerate(req_id):
        token_ids[i, :PROMPT_LENS[rid]] = torch.tensor(prompts[rid])
    non_flattened_hidden_states = torch.randn(len(req_id) * SEQ, HIDDEN)  # flatten_input: [batch * seq, hidden]
    if not flat:
        non_flattened_hidden_states = non_flattened_hidden_states.view(len(req_id), SEQ, HIDDEN)
    prefill_hidden_states_for_logprobs: dict[str, torch.Tensor] = {}

    # The module's own collection statements, then its prompt-logprobs method.
    exec(collection_snippet(), {"self": runner}, {  # noqa: S102
        "self": runner, "req_id": req_id, "token_ids": token_ids,
        "non_flattened_hidden_states": non_flattened_hidden_states,
        "prefill_hidden_states_for_logprobs": prefill_hidden_states_for_logprobs})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        result = runner._get_prompt_logprobs_dict(prefill_hidden_states_for_logprobs, sched)
    inputs = (runner, weight, prompts, non_flattened_hidden_states.view(len(req_id), SEQ, HIDDEN))
    return inputs, result, model.logits_rows, peak_cpu_bytes(prof)


def main() -> None:
    # Harness: the image's stand-in `torch.hpu.synchronize` raises off a card; on a CPU there is nothing to wait for.
    torch.hpu.synchronize = lambda *a, **k: None
    out = {"fixed": False, "symptom": "", "chunk_rows": CHUNK_ROWS, "vocab": VOCAB, "prompt_tokens": PROMPT_LENS}
    try:
        (runner, weight, prompts, flat), result, logits_rows, peak = measure(CHUNK_ROWS)
    except Exception as exc:  # the symptom: the engine dies on this exception
        out["symptom"] = f"{type(exc).__name__}: {exc}"
        out["traceback_tail"] = traceback.format_exc().splitlines()[-4:]
        print(json.dumps(out))
        return

    problems = []
    max_abs = 0.0
    for i, rid in enumerate(PROMPT_LENS):
        n = PROMPT_LENS[rid] - 1
        got = result.get(rid)
        if got is None:
            problems.append(f"{rid}: no prompt logprobs returned")
            continue
        # Reference: the whole prompt's fp32 logits at once (vLLM's own compute_logprobs), then the prompt token's
        # logprob and rank and the top-k, computed here directly.
        ref = reference(Sampler.compute_logprobs(F.linear(flat[i, :n], weight)), torch.tensor(prompts[rid][1:n + 1]))
        if tuple(got.logprobs.shape) != (n, NUM_LOGPROBS + 1):
            problems.append(f"{rid}: shape {tuple(got.logprobs.shape)}")
            continue
        if not torch.equal(got.logprob_token_ids, ref.logprob_token_ids.to(got.logprob_token_ids.dtype)):
            problems.append(f"{rid}: token ids differ from the reference")
        if not torch.equal(got.selected_token_ranks, ref.selected_token_ranks.to(got.selected_token_ranks.dtype)):
            problems.append(f"{rid}: ranks differ from the reference")
        diff = (got.logprobs - ref.logprobs).abs().max().item()
        max_abs = max(max_abs, diff)
        if not torch.allclose(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5):
            problems.append(f"{rid}: logprobs differ from the reference by {diff}")

    # The int64 contract of the prompt-logprobs gather (the CPU LogprobsTensors narrows the copy to int32).
    ids = torch.tensor(prompts["req-a"][1:5])
    gathered = runner._gather_prompt_logprobs_hpu(Sampler.compute_logprobs(F.linear(flat[0, :4], weight)),
                                                  NUM_LOGPROBS, ids)
    # The same batch with one chunk for the whole request (what the stock path allocates), for comparison.
    _, _, whole_rows, whole_peak = measure(1 << 30)
    # The models outside flatten_input ([batch, seq, hidden] hidden states) give the same result as before.
    _, batched, _, _ = measure(CHUNK_ROWS, flat=False)
    os.environ["VLLM_PROMPT_LOGPROBS_CHUNK_ROWS"] = str(CHUNK_ROWS)
    max_rows = max(logits_rows)
    if max_rows > CHUNK_ROWS:
        problems.append(f"a logits tensor of {max_rows} rows > chunk of {CHUNK_ROWS}")
    if peak > 3 * CHUNK_ROWS * VOCAB * 4:
        problems.append(f"peak CPU allocation {peak} B > 3 x the fp32 logits of one chunk")
    for rid in PROMPT_LENS:
        fields = ("logprob_token_ids", "logprobs", "selected_token_ranks")
        if any(not torch.equal(getattr(batched[rid], f), getattr(result[rid], f)) for f in fields):
            problems.append(f"{rid}: [batch, seq, hidden] hidden states give a different result")
    if gathered.logprob_token_ids.dtype != torch.int64:
        problems.append(f"gathered token ids are {gathered.logprob_token_ids.dtype}")
    out.update({
        "max_abs_diff": max_abs,
        "logits_rows": logits_rows,
        "peak_cpu_bytes": peak,
        "whole_request_logits_rows": whole_rows,
        "whole_request_peak_cpu_bytes": whole_peak,
        "fp32_logits_bytes_chunk": CHUNK_ROWS * VOCAB * 4,
        "fp32_logits_bytes_whole_request": (max(PROMPT_LENS.values()) - 1) * VOCAB * 4,
        "gather_ids_dtype": str(gathered.logprob_token_ids.dtype),
        "problems": problems,
    })
    out["fixed"] = not problems
    out["symptom"] = "; ".join(problems) if problems else (
        f"values equal to the full-logits reference (max abs diff {max_abs:.2e}); largest logits tensor "
        f"{max_rows} x {VOCAB}, peak CPU allocation {peak / 2**20:.1f} MiB (one chunk per request: "
        f"{max(whole_rows)} x {VOCAB}, {whole_peak / 2**20:.1f} MiB)")
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
