"""Reproducer for the v0.26.0 fix `seeded-sampling` (run in the simulated image by `SimImage.repro`).

The real b059f9c `InputBatch` (vllm_gaudi/v1/worker/hpu_input_batch.py) holds a seeded request (real
`SamplingParams(seed=1234)`, its `torch.Generator` seeded as the model runner seeds it) in slot 0 and an unseeded one
in slot 1. The decode batch is sampled as the runner samples it: `make_selective_sampling_metadata` with the rows
padded to the bucket by repeating the first request (`_generate_req_id_output_token_ids_lst`), then vLLM 0.26.0's
real `Sampler` (random sampling, temperature 1) on the same logits for every pad count.

Checks: (1) the seeded generator's state after one step with 2 and 6 pad rows equals its state after one step without
pad rows (one draw per step); (2) the seeded request's 8 sampled tokens are the same for 0, 2 and 6 pad rows.
Pristine every pad row is given the request's generator, which advances once more per pad row, so the stream depends
on the padding. (The lazy-mode segfault that this also causes on a Gaudi card cannot be shown on a CPU.)
"""
from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

import vllm.utils.torch_utils as torch_utils  # noqa: E402

torch_utils.PIN_MEMORY = False  # CPU: no pinned-memory allocator (vLLM's unspecified platform claims one)

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

VOCAB, SEED, STEPS = 64, 1234, 8


def make_batch() -> tuple[InputBatch, torch.Generator]:
    batch = InputBatch(max_num_reqs=8, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=VOCAB, block_sizes=[16], kernel_block_sizes=[16])
    params = SamplingParams(temperature=1.0, seed=SEED)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(params.seed)
    for slot, (req_id, sp, gen) in enumerate([("seeded", params, generator),
                                              ("unseeded", SamplingParams(temperature=1.0), None)]):
        batch.add_request(CachedRequestState(req_id=req_id, prompt_token_ids=[1, 2, 3], mm_features=[],
                                             sampling_params=sp, generator=gen, block_ids=[[slot]],
                                             num_computed_tokens=3, output_token_ids=[]))
    batch.refresh_sampling_metadata()
    return batch, generator


def run(pads: int) -> tuple[list[int], bytes]:
    """The seeded request's tokens over STEPS decode steps with `pads` pad rows, and its generator state after step 1."""
    batch, generator = make_batch()
    rows = ["seeded", "unseeded"] + ["seeded"] * pads  # the runner pads with the first request
    logits_gen = torch.Generator().manual_seed(7)
    tokens, after_first = [], b""
    for step in range(STEPS):
        metadata = batch.make_selective_sampling_metadata([(r, []) for r in rows], skip_copy=True)
        step_logits = torch.randn(2, VOCAB, generator=logits_gen)
        logits = torch.cat([step_logits, step_logits[:1].expand(pads, VOCAB)])
        tokens.append(int(Sampler()(logits, metadata).sampled_token_ids[0, 0]))
        if step == 0:
            after_first = bytes(generator.get_state().tolist())
    return tokens, after_first


def main() -> dict:
    torch.manual_seed(0)
    results = {pads: run(pads) for pads in (0, 2, 6)}
    base_tokens, base_state = results[0]
    problems = []
    for pads in (2, 6):
        tokens, state = results[pads]
        if state != base_state:
            # how many draws of the unpadded layout match that state
            batch_gen = torch.Generator().manual_seed(SEED)
            q = torch.empty(VOCAB)
            draws = None
            for n in range(1, 16):
                q.exponential_(generator=batch_gen)
                if bytes(batch_gen.get_state().tolist()) == state:
                    draws = n
                    break
            problems.append(f"{pads} pad rows: the seeded generator advanced {draws or 'several'} times in one step, "
                            f"not once")
        if tokens != base_tokens:
            problems.append(f"{pads} pad rows: the seeded request sampled {tokens}, without padding {base_tokens}")
    return {"fixed": not problems,
            "symptom": "; ".join(problems) or "the seeded stream is the same for every pad count",
            "tokens": {str(p): t for p, (t, _) in results.items()}}


if __name__ == "__main__":
    print(json.dumps(main()))
