"""Reproducer for gdn-prefix-cache: the bookkeeping of a prefix-cache hit on a GDN hybrid with compact GDN slots.

What runs: vLLM 0.26.0's own `KVCacheManager` (its `HybridKVCacheCoordinator`, block pool, `MambaManager` in the
'align' mode vllm-gaudi runs hybrid prefix caching in, and the prefix-cache lookup) for a hybrid layout (one GDN group,
one attention group sharing the KV-cache tensors) with the seeds' hybrid blocks (384 tokens, Qwen3-Coder-Next; 1,152,
Qwen3.5-122B), the real `HPUAsyncScheduler._mamba_block_aligned_split` for the chunk ends, and the real
`HPUModelRunner.prepare_mamba_state_idxs` for the state index a request's GDN layers read and write (stub `self`
holding only what the methods read).

Request A (2 blocks + 200 tokens, a 1-block + 200 token budget per step) runs its prefill; its GDN block table is read
from the manager at every step. Then B (the same 2 blocks, another tail) and C (A's first block only) arrive and hit.

- Pristine: the scheduler ends A's chunks on kernel-chunk (128-token) multiples, not on block ends, and a hit's GDN
  layers get the request's private compact slot (`prepare_mamba_state_idxs` ignores the block table for compact
  groups): nothing holds the state at the hit's end, so the hit resumes from the slot's zeros or stale state.
- With the payload: the module-level functions the payload adds (`gdn_block_aligned_chunk` in ops/hpu_gdn_pytorch.py;
  `gdn_checkpoint_block_positions`, `gdn_checkpoint_pages`, `gdn_restore_page`, `gdn_pages_to_zero`,
  `gdn_compact_slots` in the model runner) are checked against the manager's block tables: every checkpoint is written
  to a real GDN block of A at the block end it stands for, after that block was zeroed; every hit restores the
  checkpoint written at exactly its hit length into the slot its GDN layers then read; a hit's blocks are never zeroed.
  The same checks run with deliberately off-by-one variants of each function and must catch every one.

Prints one JSON object as its last line.
"""
import json
import types

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, MambaSpec
from vllm.v1.request import Request

from vllm_gaudi.ops import hpu_gdn_pytorch as gdn
from vllm_gaudi.v1.core.sched.hpu_async_scheduler import HPUAsyncScheduler
from vllm_gaudi.v1.worker import hpu_model_runner as hmr

CHUNK = 128
NUM_BLOCKS = 64
GDN_GROUP, ATTN_GROUP = 0, 1


def manager(block: int) -> KVCacheManager:
    attn = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=16, dtype=torch.bfloat16)
    gdn_spec = MambaSpec(block_size=block, shapes=((3, 256), (4, 32, 32)), dtypes=(torch.bfloat16, torch.bfloat16),
                         mamba_type="gdn_attention", mamba_cache_mode="align", page_size_padded=attn.page_size_bytes)
    config = KVCacheConfig(num_blocks=NUM_BLOCKS,
                           kv_cache_tensors=[KVCacheTensor(size=attn.page_size_bytes * NUM_BLOCKS,
                                                           shared_by=["model.layers.3.self_attn.attn",
                                                                      "model.layers.0.linear_attn"])],
                           kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.linear_attn"], gdn_spec),
                                            KVCacheGroupSpec(["model.layers.3.self_attn.attn"], attn)])
    return KVCacheManager(config, max_model_len=8 * block, scheduler_block_size=block, hash_block_size=block,
                          enable_caching=True)


def scheduler_stub(block: int):
    model_config = types.SimpleNamespace(get_mamba_chunk_size=lambda: CHUNK,
                                         get_num_layers_by_block_type=lambda *a: 1)
    return types.SimpleNamespace(vllm_config=types.SimpleNamespace(
        model_config=model_config, parallel_config=None,
        cache_config=types.SimpleNamespace(enable_prefix_caching=True)), block_size=block)


class _GroupTables(list):
    """The two reads `prepare_mamba_state_idxs` makes of `MultiGroupBlockTable`: `.block_tables` and `[g]`."""

    @property
    def block_tables(self):
        return self


def runner_stub(req_id: str, base_slot: int, rows):
    """What `prepare_mamba_state_idxs` reads: compact GDN group 0 (one GDN group), the request's base slot and the
    request's block-table rows (one per KV-cache group, as the manager gave them)."""
    tables = _GroupTables(
        types.SimpleNamespace(get_cpu_tensor=lambda r=row: torch.tensor([list(r)], dtype=torch.int32)) for row in rows)
    runner = object.__new__(hmr.HPUModelRunner)
    runner.__dict__.update(_compact_gdn_group_ids={GDN_GROUP}, _compact_gdn_group_offset={GDN_GROUP: 0},
                           _num_gdn_groups=1, _gdn_req_to_base_slot={req_id: base_slot}, _MAMBA_PAD_BLOCK_ID=NUM_BLOCKS,
                           input_batch=types.SimpleNamespace(req_ids=[req_id], block_table=tables))
    return runner


def real_funcs():
    if not hasattr(hmr, "gdn_restore_page"):
        return None
    return {"chunk": gdn.gdn_block_aligned_chunk, "positions": hmr.gdn_checkpoint_block_positions,
            "pages": hmr.gdn_checkpoint_pages, "restore": hmr.gdn_restore_page, "zero": hmr.gdn_pages_to_zero,
            "slots": hmr.gdn_compact_slots}


def make_request(rid: str, tokens: list[int], block: int) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), None,
                   block_hasher=get_request_block_hasher(block, sha256))


def scenario(block: int, funcs, budget: int):
    """Run A's prefill (``budget`` tokens a step), then hits B and C, with the payload's functions ``funcs``;
    return (failures, record)."""
    fails: list[str] = []
    km = manager(block)
    sched = scheduler_stub(block)
    prefix = list(range(1000, 1000 + 2 * block))
    a = make_request("A", prefix + list(range(200)), block)
    zeroed: set[int] = set()
    written: dict[int, tuple[str, int]] = {}
    chunk_ends, seen_positions = [], 0
    while a.num_computed_tokens < a.num_prompt_tokens:
        km.new_step_starts()
        n = min(budget, a.num_prompt_tokens - a.num_computed_tokens)
        by_scheduler = HPUAsyncScheduler._mamba_block_aligned_split(sched, a, n)
        n = funcs["chunk"](a.num_computed_tokens, n, a.num_prompt_tokens, block, CHUNK)
        if by_scheduler != n:
            fails.append(f"the scheduler gives A {by_scheduler} tokens at {a.num_computed_tokens}, the bookkeeping {n}")
        if km.allocate_slots(a, n) is None:
            raise RuntimeError("KV cache manager refused A's chunk")
        row = km.get_block_ids("A")[GDN_GROUP]
        zeroed |= set(funcs["zero"](row, seen_positions))
        seen_positions = len(row)
        for j, page in funcs["pages"](row, funcs["positions"](a.num_computed_tokens, n, block)):
            if not a.num_computed_tokens < (j + 1) * block <= a.num_computed_tokens + n:
                fails.append(f"A's chunk {a.num_computed_tokens}..{a.num_computed_tokens + n} has no state at the "
                             f"end of block position {j} (token {(j + 1) * block})")
            if not (0 <= j < len(row)) or int(row[j]) != page or page == hmr.GDN_NULL_BLOCK_ID:
                fails.append(f"A writes position {j} to page {page}, not its GDN block {row}")
            if page not in zeroed:
                fails.append(f"A writes page {page} that was never zeroed")
            written[page] = ("A", (j + 1) * block)
        a.num_computed_tokens += n
        chunk_ends.append(a.num_computed_tokens)
    for end in chunk_ends[:-1]:
        if end % block:
            fails.append(f"A's chunk ends at {end}, not on a {block}-token block boundary")
    km.free(a)
    hits = []
    for rid, tokens in (("B", prefix + list(range(5000, 5300))), ("C", prefix[:block] + list(range(7000, 7100)))):
        km.new_step_starts()
        r = make_request(rid, tokens, block)
        computed, hit, *_ = km.get_computed_blocks(r)
        if km.allocate_slots(r, r.num_prompt_tokens - hit, hit, computed) is None:
            raise RuntimeError(f"KV cache manager refused {rid}")
        row = km.get_block_ids(rid)[GDN_GROUP]
        try:
            page = funcs["restore"](row, hit, block)
        except (ValueError, IndexError) as exc:
            page = None
            fails.append(f"{rid}: hit of {hit} tokens finds no checkpoint ({exc})")
        if page is not None and written.get(page) != ("A", hit):
            fails.append(f"{rid}: hit of {hit} tokens restores page {page} holding {written.get(page)}")
        new_pages = funcs["zero"](row, hit // block)
        if page is not None and page in new_pages:
            fails.append(f"{rid}: the hit's checkpoint page {page} is zeroed as a new block")
        base_slot = 3
        runner = runner_stub(rid, base_slot, km.get_block_ids(rid))
        offsets = hmr.compute_prefix_caching_block_indices(1, [hit], [r.num_prompt_tokens - hit], block)[0]
        read_slot = int(runner.prepare_mamba_state_idxs([0], offsets, 1)[GDN_GROUP, 0])
        if funcs["slots"](base_slot, 1)[0] != read_slot:
            fails.append(f"{rid}: restores into slot {funcs['slots'](base_slot, 1)[0]}, its GDN layers read "
                         f"slot {read_slot}")
        hits.append({"req": rid, "hit_tokens": hit, "gdn_blocks": list(row), "restore_page": page,
                     "slot": read_slot})
        km.free(r)
    return fails, {"block": block, "budget": budget, "a_chunk_ends": chunk_ends, "a_checkpoints": {str(p): v[1] for p, v in
                                                                                  written.items()}, "hits": hits}


def off_by_one(real):
    """Deliberately wrong variants, one function at a time."""
    return {
        "positions+1": dict(real, positions=lambda c, n, b: [j + 1 for j in real["positions"](c, n, b)]),
        "positions-1": dict(real, positions=lambda c, n, b: [j - 1 for j in real["positions"](c, n, b) if j > 0]),
        "restore_next_block": dict(real, restore=lambda row, h, b: int(row[h // b])),
        "restore_previous_block": dict(real, restore=lambda row, h, b: int(row[h // b - 2])),
        "chunk_end+128": dict(real, chunk=lambda c, n, e, b, k: min(real["chunk"](c, n, e, b, k) + k, e - c)),
        "zero_from_previous_position": dict(real, zero=lambda row, f: real["zero"](row, max(f - 1, 0))),
        "slot+1": dict(real, slots=lambda base, g: [s + 1 for s in real["slots"](base, g)]),
    }


def pristine_behaviour(block: int):
    """What b059f9c does for the same requests: its chunk ends and the state index a hit reads."""
    km = manager(block)
    sched = scheduler_stub(block)
    prefix = list(range(1000, 1000 + 2 * block))
    a = make_request("A", prefix + list(range(200)), block)
    ends = []
    while a.num_computed_tokens < a.num_prompt_tokens:
        km.new_step_starts()
        n = min(block + 200, a.num_prompt_tokens - a.num_computed_tokens)
        n = HPUAsyncScheduler._mamba_block_aligned_split(sched, a, n)
        km.allocate_slots(a, n)
        a.num_computed_tokens += n
        ends.append(a.num_computed_tokens)
    km.free(a)
    km.new_step_starts()
    b = make_request("B", prefix + list(range(5000, 5300)), block)
    computed, hit, *_ = km.get_computed_blocks(b)
    km.allocate_slots(b, b.num_prompt_tokens - hit, hit, computed)
    row = km.get_block_ids("B")[GDN_GROUP]
    runner = runner_stub("B", 3, km.get_block_ids("B"))
    offsets = hmr.compute_prefix_caching_block_indices(1, [hit], [b.num_prompt_tokens - hit], block)[0]
    read_slot = int(runner.prepare_mamba_state_idxs([0], offsets, 1)[GDN_GROUP, 0])
    return {"block": block, "a_chunk_ends": ends, "b_hit_tokens": hit, "b_gdn_blocks": list(row),
            "b_state_index": read_slot}


def main() -> None:
    init_none_hash(sha256)
    funcs = real_funcs()
    if funcs is None:
        pristine = [pristine_behaviour(b) for b in (384, 1152)]
        p = pristine[0]
        off = [e for e in p["a_chunk_ends"][:-1] if e % p["block"]]
        symptom = (f"a prefix hit of {p['b_hit_tokens']} tokens reads GDN state index {p['b_state_index']} (the "
                   f"request's private compact slot); the hit's cached GDN block "
                   f"{p['b_gdn_blocks'][p['b_hit_tokens'] // p['block'] - 1]} holds no checkpoint (nothing writes one); "
                   f"chunk ends {off} are not on {p['block']}-token block boundaries")
        print(json.dumps({"fixed": False, "symptom": symptom, "pristine": pristine}))
        return
    runs = [(b, budget) for b in (384, 1152) for budget in (b, b + 200)]
    results, all_fails = [], []
    for block, budget in runs:
        fails, record = scenario(block, funcs, budget)
        all_fails += fails
        results.append(record)
    caught = {}
    for name, variant in off_by_one(funcs).items():
        try:
            caught[name] = bool(sum((scenario(b, variant, budget)[0] for b, budget in runs), []))
        except Exception as exc:  # an off-by-one that crashes the bookkeeping is caught too
            caught[name] = f"raised {type(exc).__name__}: {exc}"
    fixed = not all_fails and all(bool(v) for v in caught.values())
    hits = [h for r in results for h in r["hits"]]
    symptom = ("every hit restores the checkpoint written at exactly its hit length: " +
               ", ".join(f"{h['hit_tokens']} tokens -> page {h['restore_page']} -> slot {h['slot']}" for h in hits)
               if not all_fails else "; ".join(all_fails))
    print(json.dumps({"fixed": fixed, "symptom": symptom, "failures": all_fails, "off_by_one_caught": caught,
                      "results": results}))


if __name__ == "__main__":
    main()
