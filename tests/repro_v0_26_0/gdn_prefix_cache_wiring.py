"""Wiring reproducer for gdn-prefix-cache: the real GDN layer forward fed by the model runner's checkpoint plans.

What runs: the real `vllm_gaudi.models.qwen3_5.HPUGatedDeltaNetAttention.forward` (prefill and decode branches: the
real conv-state op, gating, chunked and recurrent delta rule, slot reads and writes) on CPU, with small stand-in
projections (identity norm, an out-projection that pads back to the hidden size, the input projections read the hidden
state's columns), its compact state slots, and the pages of an attention KV cache in the real HPU flat layout. Around
it: vLLM 0.26.0's own `KVCacheManager` (hybrid GDN + attention groups, 'align' mode, prefix caching) for the block
tables, and the real `HPUModelRunner` methods the payload adds (`_gdn_bind_checkpoint_pages`, `_gdn_plan_prompt`,
`_gdn_plan_decode`, with a stub `self`) for the plans the runner hands each forward.

Request A: a prompt of 2 blocks less one token, prefilled in block-aligned chunks, then one decode step that completes
block 2. Request B: A's tokens plus a tail (vLLM's manager gives it a hit of 2 blocks, the second completed by the
decode); C: A's first block plus a tail (a hit of 1 block). Their outputs after the hit must equal their cold runs
(the same tokens in one piece, in a fresh slot). E: A's tokens and one more, as a request resumed after preemption: a
hit of 2 blocks leaves one token, which runs as a decode step; the runner's decode plan restores its slot first.
Pristine: the forward has no checkpoints, so B resumes from its private slot (re-used: the previous owner's state).
`vllm.model_executor.models.qwen3_5` (the multimodal Qwen3.5 model, which needs torchvision, absent from the image) is
replaced by an empty module before the import: vllm_gaudi only rebinds a class name in it.

Prints one JSON object as its last line.
"""
import json
import os
import sys
import types

os.environ.setdefault("VLLM_GDN_COMPUTE_FP32", "1")
sys.modules.setdefault("vllm.model_executor.models.qwen3_5", types.ModuleType("vllm.model_executor.models.qwen3_5"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,  # noqa: E402
                                        KVCacheTensor, MambaSpec)
from vllm.v1.request import Request  # noqa: E402

from vllm_gaudi.attention.backends.hpu_attn import HPUAttentionBackend  # noqa: E402
from vllm_gaudi.models import qwen3_5  # noqa: E402
from vllm_gaudi.ops import hpu_gdn_pytorch as gdn  # noqa: E402
from vllm_gaudi.v1.worker import hpu_model_runner as hmr  # noqa: E402

BLOCK, CHUNK, NUM_BLOCKS = 384, 128, 16
HK, HV, KD, VD, WIDTH = 2, 4, 32, 32, 4
QKV = 2 * HK * KD + HV * VD
Z = HV * VD
HIDDEN = QKV + Z + 2 * HV
GDN_NAME, ATTN_NAME = "model.layers.0.linear_attn", "model.layers.3.self_attn.attn"
TOL = 1e-4


def make_layer(seed: int):
    g = torch.Generator().manual_seed(seed)
    layer = object.__new__(qwen3_5.HPUGatedDeltaNetAttention)
    torch.nn.Module.__init__(layer)
    conv = torch.nn.Conv1d(QKV, QKV, WIDTH, groups=QKV, bias=True)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(QKV, 1, WIDTH, generator=g) * 0.5)
        conv.bias.copy_(torch.randn(QKV, generator=g) * 0.1)
    layer.conv1d = conv
    layer.A_log = torch.randn(HV, generator=g) * 0.5
    layer.dt_bias = torch.randn(HV, generator=g) * 0.5
    layer.__dict__.update(
        in_proj_qkvz=lambda h: (h[:, :QKV + Z], None), in_proj_ba=lambda h: (h[:, QKV + Z:], None),
        norm=lambda x, z: x,
        out_proj=lambda x: (torch.nn.functional.pad(x, (0, HIDDEN - x.shape[-1])), None), gqa_interleaved_layout=False, activation="silu",
        key_dim=HK * KD, value_dim=HV * VD, tp_size=1, head_k_dim=KD, head_v_dim=VD, num_v_heads=HV, num_k_heads=HK,
        mamba_chunk_size=CHUNK, qkv_size=QKV, z_size=Z, cache_group_idx=torch.tensor(0),
        cache_config=types.SimpleNamespace(mamba_block_size=BLOCK))
    return layer


def kv_config():
    attn = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=16, dtype=torch.bfloat16)
    spec = MambaSpec(block_size=BLOCK, shapes=((WIDTH - 1, QKV), (HV, VD, KD)), dtypes=(torch.float32, torch.float32),
                     mamba_type="gdn_attention", mamba_cache_mode="align", page_size_padded=attn.page_size_bytes)
    return KVCacheConfig(num_blocks=NUM_BLOCKS,
                         kv_cache_tensors=[KVCacheTensor(size=attn.page_size_bytes * NUM_BLOCKS,
                                                         shared_by=[ATTN_NAME, GDN_NAME])],
                         kv_cache_groups=[KVCacheGroupSpec([GDN_NAME], spec), KVCacheGroupSpec([ATTN_NAME], attn)])


class _Tables(list):

    @property
    def block_tables(self):
        return self


def make_runner(layer, km, slots):
    runner = object.__new__(hmr.HPUModelRunner)
    compilation = types.SimpleNamespace(static_forward_context={GDN_NAME: layer})
    runner.__dict__.update(_compact_gdn_group_ids={0}, _compact_gdn_group_offset={0: 0}, _num_gdn_groups=1,
                           _gdn_req_to_base_slot={}, _gdn_restore_reqs=set(), _gdn_checkpoint_plans={},
                           _gdn_ckpt_block_size=0, use_prefix_caching=True, _MAMBA_PAD_BLOCK_ID=NUM_BLOCKS,
                           vllm_config=types.SimpleNamespace(compilation_config=compilation))
    shape = HPUAttentionBackend.get_kv_cache_shape(NUM_BLOCKS * BLOCK // CHUNK + 1, CHUNK, 1, 16)
    kv_caches = {GDN_NAME: slots, ATTN_NAME: (torch.zeros(shape, dtype=torch.bfloat16),
                                              torch.zeros(shape, dtype=torch.bfloat16), None, None)}
    runner._gdn_bind_checkpoint_pages(kv_config(), kv_caches)
    return runner


def set_batch(runner, km, req_ids):
    rows = [km.get_block_ids(r)[0] for r in req_ids]
    width = max(len(r) for r in rows)
    table = torch.zeros(len(rows), width, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, :len(r)] = torch.tensor(r)
    runner.input_batch = types.SimpleNamespace(
        req_ids=list(req_ids), block_table=_Tables([types.SimpleNamespace(
            get_cpu_tensor=lambda t=table: t, num_blocks_per_row=np.array([len(r) for r in rows]))]))


def forward(layer, hidden, slot, is_prompt, has_init):
    md = types.SimpleNamespace(is_prompt=is_prompt, load_indices_tensor=torch.tensor([[slot]], dtype=torch.int32),
                               query_start_loc_p=torch.tensor([0, hidden.shape[0]], dtype=torch.int32),
                               has_initial_states_p=torch.tensor([int(has_init)], dtype=torch.int32),
                               padding_mask_flat=None)
    qwen3_5.get_forward_context = lambda: types.SimpleNamespace(attn_metadata=md)
    with torch.no_grad():
        return layer(hidden).view(hidden.shape[0], -1)[:, :Z]


def main() -> None:
    init_none_hash(sha256)
    patched = hasattr(hmr.HPUModelRunner, "_gdn_plan_prompt")
    embed = torch.randn(4096, HIDDEN, generator=torch.Generator().manual_seed(5))
    layer = make_layer(3)
    slots = (torch.zeros(6, WIDTH - 1, QKV), torch.zeros(6, HV, VD, KD))
    layer.kv_cache = slots
    km = KVCacheManager(kv_config(), max_model_len=8 * BLOCK, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                        enable_caching=True)
    runner = make_runner(layer, km, slots) if patched else None
    hasher = get_request_block_hasher(BLOCK, sha256)
    a_tokens = list(range(100, 100 + 2 * BLOCK - 1))
    a = Request("A", a_tokens, SamplingParams(max_tokens=4), None, block_hasher=hasher)

    def plan_prompt(req_id, computed, n):
        if patched:
            set_batch(runner, km, [req_id])
            gdn.set_gdn_checkpoint_plan(runner._gdn_plan_prompt(req_id, 0, computed, n))

    # A: prefill in block-aligned chunks, slot 1.
    if patched:
        runner._gdn_restore_reqs.add("A")
    while a.num_computed_tokens < a.num_prompt_tokens:
        km.new_step_starts()
        n = min(BLOCK, a.num_prompt_tokens - a.num_computed_tokens)
        km.allocate_slots(a, n)
        plan_prompt("A", a.num_computed_tokens, n)
        forward(layer, embed[a_tokens[a.num_computed_tokens:a.num_computed_tokens + n]], 1, True,
                a.num_computed_tokens > 0)
        a.num_computed_tokens += n
    # A: one decode step; its token completes block 2.
    tok = 777
    a.append_output_token_ids(tok)
    km.new_step_starts()
    km.allocate_slots(a, 1)
    if patched:
        set_batch(runner, km, ["A"])
        gdn.set_gdn_checkpoint_plan(runner._gdn_plan_decode(1, np.array([a.num_computed_tokens]), [1]))
    forward(layer, embed[[tok]], 1, False, True)
    a.num_computed_tokens += 1
    km.free(a)
    # B: A's tokens and a tail (a hit of 2 blocks: the second written by A's decode); C: A's first block and a
    # tail (a hit of 1 block, written by A's first prefill chunk). Each gets slot 2, re-used: it holds the state its
    # previous owner left (D, a cold unrelated request, then B).
    forward(layer, embed[list(range(3500, 3800))], 2, True, False)
    results = []
    for rid, tokens, want in (("B", a_tokens + [tok] + list(range(2000, 2200)), 2 * BLOCK),
                              ("C", a_tokens[:BLOCK] + list(range(3000, 3100)), BLOCK)):
        r = Request(rid, tokens, SamplingParams(max_tokens=4), None, block_hasher=hasher)
        km.new_step_starts()
        computed, hit, *_ = km.get_computed_blocks(r)
        km.allocate_slots(r, len(tokens) - hit, hit, computed)
        if patched:
            runner._gdn_restore_reqs.add(rid)
        plan_prompt(rid, hit, len(tokens) - hit)
        out_hit = forward(layer, embed[tokens[hit:]], 2, True, hit > 0)
        if patched:
            gdn.set_gdn_checkpoint_plan(None)
        out_cold = forward(layer, embed[tokens], 4, True, False)  # the same tokens in one piece, a fresh slot
        err = float((out_hit - out_cold[hit:]).abs().max()) if hit else None
        results.append({"req": rid, "hit_tokens": hit, "expected_hit": want, "max_hit_vs_cold": err,
                        "gdn_blocks": km.get_block_ids(rid)[0]})
        km.free(r)
    # E: A's tokens again (resumed after preemption, say): a hit of 2 blocks leaves one token, run as a decode step;
    # the runner's decode plan restores the slot first (slot 2, stale: C's state).
    e_tokens = a_tokens + [tok, 4000]
    e = Request("E", e_tokens, SamplingParams(max_tokens=4), None, block_hasher=hasher)
    km.new_step_starts()
    computed, hit, *_ = km.get_computed_blocks(e)
    km.allocate_slots(e, len(e_tokens) - hit, hit, computed)
    if patched:
        runner._gdn_restore_reqs.add("E")
        set_batch(runner, km, ["E"])
        gdn.set_gdn_checkpoint_plan(runner._gdn_plan_decode(1, np.array([hit]), [1]))
    out_hit = forward(layer, embed[e_tokens[hit:]], 2, False, True) if hit == len(e_tokens) - 1 else None
    if patched:
        gdn.set_gdn_checkpoint_plan(None)
    out_cold = forward(layer, embed[e_tokens], 4, True, False)
    results.append({"req": "E (decode)", "hit_tokens": hit, "expected_hit": 2 * BLOCK,
                    "max_hit_vs_cold": None if out_hit is None else float((out_hit - out_cold[hit:]).abs().max()),
                    "gdn_blocks": km.get_block_ids("E")[0]})
    km.free(e)
    fixed = all(x["hit_tokens"] == x["expected_hit"] and x["max_hit_vs_cold"] is not None
                and x["max_hit_vs_cold"] < TOL for x in results)
    where = ("the checkpoints the runner's plans had the forward write (B and E: by A's decode, C: by A's first "
             "chunk; E restored by a decode step)"
             if patched else "the request's private slot (the previous owner's state left in it)")
    symptom = (f"hits resume from {where}: " + ", ".join(
        f"{x['req']} {x['hit_tokens']} tokens max |hit - cold| = "
        + (f"{x['max_hit_vs_cold']:.3e}" if x["max_hit_vs_cold"] is not None else "n/a (no hit)") for x in results))
    print(json.dumps({"fixed": fixed, "symptom": symptom, "patched": patched, "results": results,
                      "tolerance": TOL}))


if __name__ == "__main__":
    main()
