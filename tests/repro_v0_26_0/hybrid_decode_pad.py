"""Reproducer for hybrid-decode-pad: the real `HPUModelRunner.initialize_kv_cache` on a hybrid (attention + GDN) layout.

The KV manager's hybrid block holds 384 tokens; the HPU attention kernel works on 128-token blocks, so every
scheduler block b is split into kernel blocks 3b, 3b+1, 3b+2 (vLLM's `BlockTable` virtual block splitting), and
`initialize_kv_cache` allocates `num_blocks * 3 + 1` kernel blocks: the live ones plus one spare. The pristine method
then sets the pad block to `num_blocks` (and the pad slot to `num_blocks * 128`): a kernel block inside the live range,
part of scheduler block `num_blocks // 3`. The decode path fills padded batch rows with that block
(`block_number = ... * self._PAD_BLOCK_ID`, pad slots from `_PAD_BLOCK_ID * decode_block_size`) and pads the block
list with it, so with two or more concurrent decodes padded to a bucket the pad rows' KV writes land in another
request's block.

What runs: the real `initialize_kv_cache` (group set-up, `prepare_kernel_block_sizes`, `may_reinitialize_input_batch`
building the real `InputBatch` / `MultiGroupBlockTable`, the hybrid allocation loop with the real HPU attention
backend's `get_kv_cache_shape`, vLLM's `bind_kv_cache`) on CPU tensors, with a runner made by `object.__new__` holding
only the configuration attributes the method reads. Then a real request is added to the runner's new input batch so
vLLM's block table maps its scheduler blocks to kernel blocks. Prints one JSON object as its last line.
"""
import json
import types

import torch
from vllm.config import CompilationConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, MambaSpec
from vllm.v1.worker.utils import AttentionGroup

from vllm_gaudi.v1.attention.backends.hpu_attn import HPUAttentionBackendV1
from vllm_gaudi.v1.worker import hpu_model_runner as hmr
from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState

HYBRID_BLOCK = 384  # the KV manager's block (inflated for the GDN state page)
KERNEL_BLOCK = 128
NUM_BLOCKS = 8
ATTN = "model.layers.3.self_attn.attn"
GDN = "model.layers.0.linear_attn"


def kv_cache_config():
    attn = FullAttentionSpec(block_size=HYBRID_BLOCK, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    gdn = MambaSpec(block_size=HYBRID_BLOCK, shapes=((2, 4), ), dtypes=(torch.float32, ), mamba_type="gdn_attention")
    return KVCacheConfig(num_blocks=NUM_BLOCKS,
                         kv_cache_tensors=[KVCacheTensor(size=attn.page_size_bytes * NUM_BLOCKS, shared_by=[ATTN]),
                                           KVCacheTensor(size=gdn.page_size_bytes * NUM_BLOCKS, shared_by=[GDN])],
                         kv_cache_groups=[KVCacheGroupSpec(layer_names=[GDN], kv_cache_spec=gdn),
                                          KVCacheGroupSpec(layer_names=[ATTN], kv_cache_spec=attn)])


def make_runner(config):
    runner = object.__new__(hmr.HPUModelRunner)
    static_ctx = {ATTN: types.SimpleNamespace(kv_cache=None), GDN: types.SimpleNamespace(kv_cache=None)}
    compilation = CompilationConfig()
    compilation.static_forward_context = static_ctx
    vllm_config = types.SimpleNamespace(
        compilation_config=compilation, cache_config=types.SimpleNamespace(block_size=HYBRID_BLOCK),
        offload_config=types.SimpleNamespace(uva=types.SimpleNamespace(cpu_offload_gb=0)), speculative_config=None,
        kv_transfer_config=None)
    runner.__dict__.update(
        vllm_config=vllm_config, cache_config=vllm_config.cache_config, _compact_gdn_group_ids=set(),
        _compact_gdn_group_offset={}, shared_kv_cache_layers={}, runner_only_attn_layers=set(), num_mamba_like_layers=1,
        num_gdn=1, model=types.SimpleNamespace(config=types.SimpleNamespace(architectures=[])),
        attn_groups=[[], [AttentionGroup(HPUAttentionBackendV1, [ATTN], config.kv_cache_groups[1].kv_cache_spec, 1)]],
        attn_backend=HPUAttentionBackendV1, block_size=KERNEL_BLOCK, attn_block_size=KERNEL_BLOCK,
        enable_bucketing=False, _compact_gdn_enabled=False, _original_max_num_seqs=4, use_hybrid_cache=True,
        use_naive_mamba_cache_sharing=False, device=torch.device("cpu"), pin_memory=False, max_num_reqs=4,
        max_model_len=HYBRID_BLOCK * NUM_BLOCKS, max_encoder_len=0, max_num_tokens=1024,
        model_config=types.SimpleNamespace(get_vocab_size=lambda: 64), input_batch=types.SimpleNamespace(
            logitsprocs=None), is_pooling_model=False, kv_caches=[])
    return runner


def main() -> None:
    config = kv_cache_config()
    runner = make_runner(config)
    runner.initialize_kv_cache(config)

    key_cache = runner.kv_caches[[i for i, t in enumerate(runner.kv_caches) if isinstance(t, tuple) and len(t) == 4][0]][0]
    # HPU paged attention keeps a flat token-slot cache: (kernel blocks * kernel block size, heads, head size).
    cache_slots = int(key_cache.shape[0])
    kernel_blocks_allocated = cache_slots // runner.attn_block_size
    # A request holding every allocatable scheduler block (block 0 is vLLM's null block), in the runner's real batch.
    owned = list(range(1, NUM_BLOCKS))
    req = CachedRequestState(req_id="A", prompt_token_ids=[1] * (HYBRID_BLOCK * len(owned)), mm_features=[],
                             sampling_params=SamplingParams(max_tokens=4), generator=None,
                             block_ids=[owned, owned], num_computed_tokens=0, output_token_ids=[])
    runner.input_batch.add_request(req)
    attn_table = runner.input_batch.block_table[runner._get_attention_group_id_for_hybrid()]
    kernel_ids = attn_table.get_cpu_tensor()[0, :len(owned) * HYBRID_BLOCK // KERNEL_BLOCK].tolist()
    live = sorted(set(kernel_ids))
    pad = int(runner._PAD_BLOCK_ID)
    pad_slot = int(runner._PAD_SLOT_ID)
    pad_slots = range(pad * KERNEL_BLOCK, pad * KERNEL_BLOCK + KERNEL_BLOCK)  # the decode path's dummy slots
    pad_in_live = pad in live
    scratch = kernel_blocks_allocated - 1
    fixed = (not pad_in_live and pad == scratch and pad_slot == scratch * KERNEL_BLOCK and pad_slots.stop <= cache_slots
             and int(runner._MAMBA_PAD_BLOCK_ID) == NUM_BLOCKS)
    if pad_in_live:
        owner = pad // (HYBRID_BLOCK // KERNEL_BLOCK)
        symptom = (f"decode pad block {pad} is a live kernel block (scheduler block {owner}, kernel blocks "
                   f"{live[0]}..{live[-1]} live of {kernel_blocks_allocated}): pad slots {pad_slots.start}.."
                   f"{pad_slots.stop - 1} overwrite request A's KV")
    else:
        symptom = (f"decode pad block {pad} of {kernel_blocks_allocated} kernel blocks is outside the live ones "
                   f"{live[0]}..{live[-1]}" + (" (the spare, last block)" if pad == scratch else ""))
    print(json.dumps({"fixed": fixed, "symptom": symptom, "pad_block_id": pad, "pad_slot_id": pad_slot,
                      "mamba_pad_block_id": int(runner._MAMBA_PAD_BLOCK_ID), "num_blocks": NUM_BLOCKS,
                      "kernel_blocks_allocated": kernel_blocks_allocated, "cache_slots": cache_slots, "attn_block_size": runner.attn_block_size,
                      "live_kernel_blocks": live}))


if __name__ == "__main__":
    main()
