"""Reproducer for `logprobs-decode-guard` (vllm-gaudi v0.26.0, b059f9c).

The bug is in vLLM 0.26.0's frontend: `LogprobsProcessor` (vllm/v1/engine/logprobs.py), run by the API server's
`AsyncLLM.output_handler` through `OutputProcessor.process_outputs`, detokenizes every logprob token id; an id the
tokenizer rejects raises there, the output handler dies ("AsyncLLM output_handler failed.") and the server stops
serving. The hook lives in vllm_gaudi/patches.py and is installed the way the image installs it: `patches.apply()`
(run by the platform plugin `vllm_gaudi:register` in every process) wraps `vllm.plugins.load_general_plugins`, which
vLLM calls in the API-server process too (EngineArgs).

This script does exactly that, then feeds vLLM's real `OutputProcessor` (the SmolLM2 tokenizer from the cookbook's
model cache) three engine-core outputs for one request:
  1. sample logprobs whose top-k holds -1 (an int32 wrap) and 2**32 + 5 (too large for the tokenizer), plus prompt
     logprobs with -3 among them;
  2. sample logprobs whose first column (the sampled slot) is -7;
  3. a sampled token whose own text is a partial UTF-8 byte ("...\ufffd"): vLLM then re-decodes it with the preceding
     sampled ids as context, which now hold -7.
Pristine, step 1 raises. Fixed: nothing raises, every bad id reads "<bad token id N>", and every good id has exactly
the text vLLM's own `convert_ids_list_to_tokens` gives it. Prints one JSON object (last line).
"""
from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
MODEL = os.path.expanduser("~/.cache/gaudi-cookbook/models-v1/smollm2-135m-instruct")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import vllm.plugins  # noqa: E402
from vllm_gaudi import patches  # noqa: E402

patches.apply()                      # what vllm_gaudi:register() does in every process
vllm.plugins.load_general_plugins()  # what EngineArgs does in the API-server process (runs the deferred patches)

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402
from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens  # noqa: E402  (vLLM's own, unhooked)
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402
from vllm.v1.outputs import LogprobsLists, LogprobsTensors  # noqa: E402

PROMPT = [1, 504, 3458, 314, 216]


def lp_lists(ids: list[int]) -> LogprobsLists:
    n = len(ids)
    return LogprobsLists(np.array([ids], dtype=np.int64), np.linspace(-0.1, -3.0, n, dtype=np.float32)[None, :],
                         np.array([1], dtype=np.int64))


def main() -> None:
    tok = get_tokenizer(MODEL)
    vocab = len(tok)
    partial = next(i for i in range(256, vocab) if tok.decode([i]).endswith("\ufffd"))  # a lone UTF-8 lead byte
    good = [28, 2114, 9037, vocab - 1]
    bad = [-1, 2**32 + 5, -3, -7]
    proc = OutputProcessor(tok, log_stats=False)
    req = EngineCoreRequest(request_id="r0", prompt_token_ids=list(PROMPT), mm_features=None,
                            sampling_params=SamplingParams(max_tokens=64, logprobs=3, prompt_logprobs=2),
                            pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                            data_parallel_rank=None, external_req_id="r0")
    proc.add_request(req, prompt=None)
    prompt_ids = torch.tensor([[504, -3, 28], [3458, 2114, 9037], [314, 28, 2114], [216, 9037, 28]], dtype=torch.int64)
    prompt_lp = LogprobsTensors(prompt_ids, torch.full(prompt_ids.shape, -1.0), torch.ones(4, dtype=torch.int64))
    steps = [
        EngineCoreOutput(request_id="r0", new_token_ids=[good[0]], new_logprobs=lp_lists([good[0], -1, 2**32 + 5, good[1]]),
                         new_prompt_logprobs_tensors=prompt_lp),
        EngineCoreOutput(request_id="r0", new_token_ids=[good[1]], new_logprobs=lp_lists([-7, good[1], good[2], good[3]])),
        EngineCoreOutput(request_id="r0", new_token_ids=[partial], new_logprobs=lp_lists([partial, good[0], good[2], good[3]])),
    ]
    done = 0
    try:
        for out in steps:
            proc.process_outputs([out])
            done += 1
    except Exception as exc:  # the symptom (it kills AsyncLLM.output_handler): report it
        print(json.dumps({"fixed": False, "symptom": f"step {done + 1}: {type(exc).__name__}: {exc}",
                          "traceback": traceback.format_exc()[-1500:]}))
        return
    state = proc.request_states["r0"].logprobs_processor
    texts: dict[int, set[str]] = {}
    for position in list(state.logprobs) + [p for p in state.prompt_logprobs if p]:
        for token_id, entry in position.items():
            texts.setdefault(int(token_id), set()).add(entry.decoded_token)
    problems = []
    for token_id in bad:
        if texts.get(token_id) != {f"<bad token id {token_id}>"}:
            problems.append(f"bad id {token_id}: {texts.get(token_id)}")
    for token_id in good:
        expected = convert_ids_list_to_tokens(tok, [token_id])[0]
        if token_id in texts and texts[token_id] != {expected}:
            problems.append(f"good id {token_id}: {texts[token_id]} != {expected!r}")
    expected_partial = tok.decode([partial])
    if texts.get(partial) != {expected_partial}:
        problems.append(f"partial-byte id {partial}: {texts.get(partial)} != {expected_partial!r}")
    print(json.dumps({"fixed": not problems,
                      "symptom": "; ".join(problems) or "no exception; bad ids replaced, good ids decoded as vLLM does",
                      "texts": {str(k): sorted(v) for k, v in texts.items()}, "vocab": vocab}))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
