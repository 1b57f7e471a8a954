"""Reproducer for the v0.26.0 fix `logitsprocs-rows` (run in the simulated image by `SimImage.repro`).

The real b059f9c `InputBatch` (vllm_gaudi/v1/worker/hpu_input_batch.py) is made with vLLM 0.26.0's real built-in
logits processors (`build_logitsprocs`: MinTokens, LogitBias, MinP) as the model runner makes it, and driven through
the calls the runner makes over two steps, with real `SamplingParams` and `CachedRequestState`:

  step 1: add plain-0, bias (logit_bias {9: +10}), mintok (min_tokens=3, EOS 7), minp (min_p=0.5, temperature 1),
          plain-4; refresh_sampling_metadata;
  step 2: remove plain-0, condense (plain-4 moves to slot 0), refresh, then swap_states(1, 3) as
          `_ensure_decodes_first` does (minp to slot 1, bias to slot 3), refresh again.

Then `make_selective_sampling_metadata` builds two sampling calls and vLLM's real `Sampler` samples logits whose
greedy choice is EOS (7), then 5, then 9 on every row:
  (i)  the decode batch: the four requests in slot order, padded to 8 rows by repeating the first (as the runner pads);
  (ii) a subset in another order, [bias, mintok, minp], as a prefill batch is sampled;
  (iii) after mintok has 3 output tokens (the runner extends its list), the decode batch again: EOS is allowed.
Expected: bias samples 9, mintok never EOS before its 3 tokens, minp only EOS (min_p cuts every other token; 20
seeded draws), the plain request EOS. Pristine no BatchUpdate reaches the processors: they hold no state and the logits
are unchanged (bias 7, mintok 7, minp draws other tokens).

Hook: the input batch's `async_h2d_update` (vllm_gaudi/utils.py) is called as it is, with `device=` the destination
tensor's device (the CPU here) instead of its hard-coded "hpu"; it is reached only with the whole profile applied.
"""
from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

import vllm.utils.torch_utils as torch_utils  # noqa: E402

torch_utils.PIN_MEMORY = False  # CPU: no pinned-memory allocator (vLLM's unspecified platform claims one)

from vllm import SamplingParams  # noqa: E402
from vllm.config import DeviceConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.v1.sample.logits_processor import build_logitsprocs  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
import vllm_gaudi.v1.worker.hpu_input_batch as hib  # noqa: E402
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

VOCAB, EOS, MAX_REQS = 32, 7, 8
_real_h2d_update = hib.async_h2d_update


def _h2d_update_on_dest_device(source, dest, indices, device="hpu"):
    """The real vllm_gaudi.utils.async_h2d_update, on the destination's device (CPU here, "hpu" on a card): with the
    whole profile applied, sampling-rows-refresh copies the swapped rows (skip_copy is then False)."""
    return _real_h2d_update(source, dest, indices, device=dest.device)


hib.async_h2d_update = _h2d_update_on_dest_device


def request(req_id: str, params: SamplingParams, slot: int) -> CachedRequestState:
    return CachedRequestState(req_id=req_id, prompt_token_ids=[1, 2, 3], mm_features=[], sampling_params=params,
                              generator=None, block_ids=[[slot]], num_computed_tokens=3, output_token_ids=[])


def make_batch() -> tuple[InputBatch, dict[str, CachedRequestState]]:
    config = VllmConfig(scheduler_config=SchedulerConfig(max_num_seqs=MAX_REQS, max_num_batched_tokens=64,
                                                         max_model_len=64, is_encoder_decoder=False),
                        device_config=DeviceConfig(device="cpu"))
    device = torch.device("cpu")
    batch = InputBatch(max_num_reqs=MAX_REQS, max_model_len=64, max_num_batched_tokens=64, device=device,
                       pin_memory=False, vocab_size=VOCAB, block_sizes=[16], kernel_block_sizes=[16],
                       logitsprocs=build_logitsprocs(config, device, False, False))
    reqs = {
        "plain-0": request("plain-0", SamplingParams(temperature=0.0), 0),
        "bias": request("bias", SamplingParams(temperature=0.0, logit_bias={9: 10.0}), 1),
        "mintok": request("mintok", SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[EOS]), 2),
        "minp": request("minp", SamplingParams(temperature=1.0, min_p=0.5), 3),
        "plain-4": request("plain-4", SamplingParams(temperature=0.0), 4),
    }
    for state in reqs.values():  # step 1
        batch.add_request(state)
    batch.refresh_sampling_metadata()
    removed = batch.remove_request("plain-0")  # step 2
    batch.condense([removed])
    batch.refresh_sampling_metadata()
    batch.swap_states(1, 3)
    # The runner refreshes before its swaps; refreshing after this one too keeps the device rows of temperature & co
    # right (their staleness after a swap is the separate fix sampling-rows-refresh), so only the logitsprocs differ.
    batch.refresh_sampling_metadata()
    want = {"plain-4": 0, "minp": 1, "mintok": 2, "bias": 3}
    assert batch.req_id_to_index == want, batch.req_id_to_index
    return batch, reqs


def logits_for(rows: int) -> torch.Tensor:
    logits = torch.zeros(rows, VOCAB)
    logits[:, EOS], logits[:, 5], logits[:, 9] = 6.0, 5.0, 1.0
    return logits


def sample(batch: InputBatch, req_ids: list[str], draws: int = 20) -> dict[str, list[int]]:
    """Each request's tokens over `draws` seeded sampler runs (its first row; pad rows are dropped as the runner does)."""
    metadata = batch.make_selective_sampling_metadata([(r, batch.req_output_token_ids[batch.req_id_to_index[r]])
                                                       for r in req_ids], skip_copy=True)
    torch.manual_seed(0)
    out: dict[str, list[int]] = {}
    for _ in range(draws):
        tokens = Sampler()(logits_for(len(req_ids)), metadata).sampled_token_ids.flatten().tolist()
        for row, req_id in enumerate(req_ids):
            if req_id not in req_ids[:row]:
                out.setdefault(req_id, []).append(tokens[row])
    return out


def check(label: str, got: dict[str, list[int]], problems: list[str], mintok_done: bool = False) -> None:
    if "bias" in got and set(got["bias"]) != {9}:
        problems.append(f"{label}: logit_bias ignored: the bias request sampled {sorted(set(got['bias']))}, not 9")
    if "mintok" in got:
        if not mintok_done and EOS in got["mintok"]:
            problems.append(f"{label}: min_tokens ignored: the min_tokens request sampled EOS {EOS} before 3 tokens")
        if mintok_done and set(got["mintok"]) != {EOS}:
            problems.append(f"{label}: min_tokens kept EOS banned after 3 tokens: {sorted(set(got['mintok']))}")
    if "minp" in got and set(got["minp"]) != {EOS}:
        problems.append(f"{label}: min_p ignored: the min_p request drew {sorted(set(got['minp']))}, not only {EOS}")
    if "plain-4" in got and set(got["plain-4"]) != {EOS}:
        problems.append(f"{label}: a plain request's logits were changed: {sorted(set(got['plain-4']))}")


def main() -> dict:
    batch, reqs = make_batch()
    problems: list[str] = []
    decode = ["plain-4", "minp", "mintok", "bias"]
    got_i = sample(batch, decode + ["plain-4"] * 4)
    check("decode batch", got_i, problems)
    got_ii = sample(batch, ["bias", "mintok", "minp"])
    check("subset [bias, mintok, minp]", got_ii, problems)
    reqs["mintok"].output_token_ids.extend([5, 5, 5])
    got_iii = sample(batch, decode + ["plain-4"] * 4, draws=1)
    check("after 3 tokens", got_iii, problems, mintok_done=True)
    summary = {k: sorted(set(v)) for k, v in got_i.items()}
    return {"fixed": not problems, "symptom": "; ".join(problems) or "logit_bias, min_p and min_tokens take effect",
            "decode_tokens": summary, "subset_tokens": {k: sorted(set(v)) for k, v in got_ii.items()},
            "after_min_tokens": {k: sorted(set(v)) for k, v in got_iii.items()}}


if __name__ == "__main__":
    print(json.dumps(main()))
