"""Contract check for `gather-logprobs-int32` (vllm-gaudi v0.26.0, b059f9c): gaudi-only bug.

vllm_gaudi/patches.py `_hpu_gather_logprobs` (installed as vLLM's `Sampler.gather_logprobs` by the deferred patches
of `patches.apply()`) casts the gathered token ids to int32 on the device; in lazy mode on a Gaudi card that cast
corrupts them (a CPU cannot show it). The payload's contract, checked here on the real installed function: the ids
leave it as int64, exactly the sampled ids and torch.topk's indices over a 151,936-token vocabulary (Qwen3's padded
size), with the logprobs and ranks vLLM's sampler defines. The patches are installed as in the image:
`patches.apply()` then `vllm.plugins.load_general_plugins()`. Prints one JSON object (last line).
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

import vllm.plugins  # noqa: E402
from vllm_gaudi import patches  # noqa: E402

patches.apply()
vllm.plugins.load_general_plugins()

import vllm.v1.sample.sampler as sampler_mod  # noqa: E402

VOCAB, ROWS, K = 151_936, 6, 5


def main() -> None:
    gather = sampler_mod.Sampler.gather_logprobs
    installed = gather is patches._hpu_gather_logprobs
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, generator=gen)
    # Make the top of each row sit at the end of the vocabulary (ids above 2**17), where a corrupted id shows.
    for row in range(ROWS):
        logits[row, VOCAB - 1 - 7 * row - torch.arange(K)] += 20.0 + torch.arange(K, dtype=torch.float32)
    logprobs = torch.log_softmax(logits, dim=-1)
    sampled = torch.tensor([VOCAB - 1, VOCAB - 2, 151_643, 131_072, 5, VOCAB - 40], dtype=torch.int64)
    out = gather(logprobs, K, token_ids=sampled)

    top_lp, top_ids = torch.topk(logprobs, K, dim=-1)
    token_lp = logprobs.gather(-1, sampled.unsqueeze(-1))
    want_ids = torch.cat((sampled.unsqueeze(-1), top_ids), dim=1)
    ids = out.logprob_token_ids
    checks = {
        "installed": installed,
        "dtype_int64": ids.dtype == torch.int64,
        "ids_exact": torch.equal(ids.long(), want_ids),
        "logprobs_exact": torch.equal(out.logprobs, torch.cat((token_lp, top_lp), dim=1)),
        "ranks_exact": torch.equal(out.selected_token_ranks, (logprobs >= token_lp).sum(-1)),
        # what reaches the host (LogprobsTensors.tolists, as the model runner's _build_logprobs_output reads it)
        "host_ids_exact": out.tolists().logprob_token_ids.tolist() == want_ids.tolist(),
        "max_id": int(ids.max()),
    }
    fixed = all(v for k, v in checks.items() if k != "max_id")
    symptom = ("logprob_token_ids are int64 and equal the sampled ids and torch.topk's indices" if fixed else
               f"logprob_token_ids dtype {ids.dtype} (contract: torch.int64); checks {checks}")
    print(json.dumps({"fixed": fixed, "symptom": symptom, "dtype": str(ids.dtype), **checks}))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
