"""Reproducer for `async-discard-counter` (vllm-gaudi v0.26.0, b059f9c).

The real `HPUAsyncScheduler` and vLLM 0.26.0's own `AsyncScheduler` are built side by side on the same config and
driven through the same async steps: prefill, a decode step left in flight, a forced preemption of every running
request (`reset_prefix_cache(reset_running_requests=True)`, which sets vLLM's counter `async_tokens_to_discard` to the
frames in flight), then the stale frame arriving, the resumed prefill and one more decode. The HPU scheduler must not
raise, and after each step its request must be in the state vLLM's own scheduler leaves it in (output tokens, counter,
placeholders, computed tokens). Prints one JSON object (last line).
"""
from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
MODEL = os.path.expanduser("~/.cache/gaudi-cookbook/models-v1/smollm2-135m-instruct")

import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from vllm_gaudi.v1.core.sched.hpu_async_scheduler import HPUAsyncScheduler  # noqa: E402

BLOCK = 16
PROMPT = list(range(100, 120))  # 20 prompt tokens


def make(cls):
    config = VllmConfig(
        model_config=ModelConfig(model=MODEL, tokenizer=MODEL, dtype="float32", max_model_len=256, seed=0),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256,
                                         async_scheduling=True, is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        device_config=DeviceConfig(device="cpu"),  # the image has no platform plugin active (VLLM_PLUGINS="")
    )
    config.cache_config.num_gpu_blocks = 64
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer.0"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=16,
                                                        dtype=torch.float32))])
    return cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
               block_size=BLOCK, log_stats=False)


def state(sched, req_id="r0"):
    r = sched.requests[req_id]
    return {"output": list(r.output_token_ids), "async_tokens_to_discard": r.async_tokens_to_discard,
            "num_output_placeholders": r.num_output_placeholders, "num_computed_tokens": r.num_computed_tokens,
            "status": r.status.name}


def output(so, token):
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)},
                             sampled_token_ids=[[token] for _ in ids])


def drive(sched):
    """The engine's async order; returns the request's state after each step."""
    sched.add_request(Request("r0", prompt_token_ids=list(PROMPT),
                              sampling_params=SamplingParams(max_tokens=8, ignore_eos=True), pooling_params=None))
    trace = []
    so1 = sched.schedule()                      # prefill (whole prompt)
    sched.update_from_output(so1, output(so1, 7001))
    trace.append(("prefill done", state(sched)))
    so2 = sched.schedule()                      # decode step, its frame stays in flight
    trace.append(("decode in flight", state(sched)))
    sched.reset_prefix_cache(reset_running_requests=True)  # forced preemption with one frame in flight
    trace.append(("preempted", state(sched)))
    sched.update_from_output(so2, output(so2, 7002))  # the stale frame comes back: must be dropped
    trace.append(("stale frame returned", state(sched)))
    so3 = sched.schedule()                      # resumed prefill (prompt + first output)
    sched.update_from_output(so3, output(so3, 7003))
    trace.append(("resumed prefill done", state(sched)))
    so4 = sched.schedule()
    sched.update_from_output(so4, output(so4, 7004))
    trace.append(("decode done", state(sched)))
    return trace


def main() -> None:
    reference = drive(make(AsyncScheduler))
    try:
        hpu = drive(make(HPUAsyncScheduler))
    except Exception as exc:  # the symptom: report it, do not crash
        print(json.dumps({"fixed": False, "symptom": f"{type(exc).__name__}: {exc}",
                          "traceback": traceback.format_exc()[-1500:], "reference": reference}))
        return
    mismatches = [{"step": a[0], "hpu": a[1], "vllm": b[1]} for a, b in zip(hpu, reference) if a[1] != b[1]]
    symptom = "no exception; request state equals vLLM's AsyncScheduler after every step" if not mismatches else \
        f"request state differs from vLLM's AsyncScheduler at: {', '.join(m['step'] for m in mismatches)}"
    print(json.dumps({"fixed": not mismatches, "symptom": symptom, "mismatches": mismatches,
                      "hpu": hpu, "reference": reference}))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
