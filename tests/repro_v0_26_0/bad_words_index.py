"""Reproducer for the v0.26.0 fix `bad-words-index` (run in the simulated image by `SimImage.repro`).

The real b059f9c `InputBatch` (vllm_gaudi/v1/worker/hpu_input_batch.py) holds three requests (slots 0, 1, 2) made
from real `SamplingParams` and `CachedRequestState`; the one in slot 2 has `bad_words=["bad"]` (token ids from
vLLM's own `SamplingParams.update_from_tokenizer`, with a toy tokenizer). Its `make_selective_sampling_metadata` builds
the metadata of two sampling calls the model runner makes, and vLLM 0.26.0's real `Sampler` (greedy; its
`apply_logits_processors` runs vLLM's `apply_bad_words`) samples logits whose argmax is the banned token on every row:

A. a prefill batch of the requests in slots 1 and 2 (two logits rows): the bad words must ban row 1 (slot 2);
B. a prefill batch of the request in slot 2 alone, padded to four logits rows as the runner pads prefill sampling
   (the pad rows repeat it): the ban must land on row 0, its own row.

Pristine the bad words are keyed by batch slot: A raises IndexError in the sampler (the engine core dies), B bans
row 2 (a pad row) and the request itself samples the banned token.
"""
from __future__ import annotations

import json
import os
import traceback

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

import vllm.utils.torch_utils as torch_utils  # noqa: E402

torch_utils.PIN_MEMORY = False  # CPU: no pinned-memory allocator (vLLM's unspecified platform claims one)

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

VOCAB = 32
BAD = 5  # the token id of the word "bad"


class ToyTokenizer:
    """Just what `SamplingParams.update_from_tokenizer` calls: `encode` and `max_token_id`."""

    max_token_id = VOCAB - 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [BAD] if text.strip() == "bad" else [VOCAB - 2]


def make_batch() -> InputBatch:
    batch = InputBatch(max_num_reqs=8, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=VOCAB, block_sizes=[16], kernel_block_sizes=[16])
    for slot in range(3):
        params = SamplingParams(temperature=0.0, bad_words=["bad"] if slot == 2 else None)
        params.update_from_tokenizer(ToyTokenizer())
        batch.add_request(CachedRequestState(req_id=f"req-{slot}", prompt_token_ids=[1, 2, 3], mm_features=[],
                                             sampling_params=params, generator=None, block_ids=[[slot]],
                                             num_computed_tokens=0, output_token_ids=[]))
    assert batch.bad_words_token_ids == {2: [[BAD]]}, batch.bad_words_token_ids
    batch.refresh_sampling_metadata()
    return batch


def sample(batch: InputBatch, req_ids: list[str]) -> list[int]:
    """The runner's `_prepare_sampling` + `Sampler` for logits rows `req_ids` (skip_copy: the batch is refreshed)."""
    metadata = batch.make_selective_sampling_metadata([(r, []) for r in req_ids], skip_copy=True)
    logits = torch.zeros(len(req_ids), VOCAB)
    logits[:, BAD] = 5.0          # the banned token is every row's argmax
    logits[:, 9] = 1.0            # the next best
    return Sampler()(logits, metadata).sampled_token_ids.flatten().tolist()


def main() -> dict:
    batch = make_batch()
    problems: list[str] = []
    out: dict = {}
    # A: rows [slot 1, slot 2]
    try:
        tokens = sample(batch, ["req-1", "req-2"])
        out["case_a_tokens"] = tokens
        if tokens[1] == BAD:
            problems.append(f"case A: slot 2 (row 1) sampled the banned token {BAD}: {tokens}")
        if tokens[0] != BAD:
            problems.append(f"case A: the ban landed on row 0 (slot 1, no bad words): {tokens}")
    except IndexError as exc:
        problems.append(f"case A: IndexError: {exc}")
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        out["case_a_raised_in"] = f"{frame.filename}:{frame.lineno} ({frame.name})"
    # B: rows [slot 2, pad, pad, pad]
    try:
        tokens = sample(batch, ["req-2"] * 4)
        out["case_b_tokens"] = tokens
        if tokens[0] == BAD:
            banned = [row for row, tok in enumerate(tokens) if tok != BAD]
            problems.append(f"case B: the request sampled the banned token {BAD} (the ban landed on rows {banned})")
    except IndexError as exc:
        problems.append(f"case B: IndexError: {exc}")
    out.update(fixed=not problems, symptom="; ".join(problems) or "bad words ban the sampled row of their request")
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
