"""Kernel reproducer for gdn-prefix-cache: the b059f9c GDN prefill path resumed from a prefix-cache hit.

What runs: the real `vllm_gaudi.ops.causal_conv1d_pytorch.hpu_causal_conv1d_fn` (the conv state op) and the real
`vllm_gaudi.ops.hpu_gdn_pytorch` gating and chunked delta rule (`hpu_fused_gdn_gating`, `hpu_chunk_gated_delta_rule`
on its bucketed 3-stage path, 128-token kernel chunks, as `models/qwen3_5.py` drives them for a prefill), on one GDN
layer with random inputs in fp32, against the real HPU attention backend's flat KV-cache shape for the pages.

1. Cold: the whole prompt in one piece (the reference).
2. Each hit the seeds' layouts allow (hybrid blocks of 384 tokens, Qwen3-Coder-Next; 1,152, Qwen3.5-122B), the prompts
   ending mid-block:
   - pristine: what the b059f9c runner hands a hit, the request's private compact slot with has_initial_state set:
     either a fresh slot (zeros) or a slot another request left behind. The output of the resumed tokens is wrong.
   - with the payload: the prefix ran with `checkpoint_chunks` at its block ends, the checkpoints (recurrent + conv
     state) were written into the GDN blocks' attention pages with `gdn_write_checkpoints`, and the hit restores
     the checkpoint of its last cached block into the slot (`gdn_read_checkpoints`) before the next chunk.
3. Everything is compared with a naive token-by-token recurrence (conv, l2norm, gated delta rule) in float64.

Prints one JSON object as its last line.
"""
import json
import os

os.environ.setdefault("VLLM_GDN_COMPUTE_FP32", "1")

import torch  # noqa: E402

from vllm_gaudi.attention.backends.hpu_attn import HPUAttentionBackend  # noqa: E402
from vllm_gaudi.ops import hpu_gdn_pytorch as gdn  # noqa: E402
from vllm_gaudi.ops.causal_conv1d_pytorch import hpu_causal_conv1d_fn  # noqa: E402

CHUNK = 128  # HPU mamba chunk (kernel chunk)
HK, HV, KD, VD, WIDTH = 2, 4, 32, 32, 4
DIM = 2 * HK * KD + HV * VD
STATE_LEN = WIDTH - 1
TOL = 1e-4  # fp32 rounding over ~1.5K tokens; the wrong-state errors are orders above it
KV_HEADS, HEAD = 1, 16  # attention page: 2 * block * 1 * 16 * 2 bytes >= checkpoint bytes


class Layer:

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(DIM, WIDTH, generator=g) * 0.5
        self.bias = torch.randn(DIM, generator=g) * 0.1
        self.A_log = torch.randn(HV, generator=g) * 0.5
        self.dt_bias = torch.randn(HV, generator=g) * 0.5


def prompt(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, DIM, generator=g), torch.randn(n, HV, generator=g), torch.randn(n, HV, generator=g))


def run_chunk(layer, x, a, b, conv_states, ssm_states, slot, has_init, block_ends=()):
    """One prefill chunk of one request through the b059f9c ops, as models/qwen3_5.py drives them."""
    n = x.shape[0]
    g, beta = gdn.hpu_fused_gdn_gating(layer.A_log, a, b, layer.dt_bias)
    init_conv = conv_states[slot].clone() * float(has_init)
    xc = hpu_causal_conv1d_fn(x=x.transpose(0, 1), weight=layer.w, bias=layer.bias, conv_states=conv_states,
                              query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                              cache_indices=torch.tensor([slot], dtype=torch.int32),
                              has_initial_state=torch.tensor([int(has_init)], dtype=torch.int32), activation="silu",
                              is_prompt=True).transpose(0, 1)
    q, k, v = torch.split(xc, [HK * KD, HK * KD, HV * VD], dim=-1)
    q, k, v = q.reshape(1, n, HK, KD), k.reshape(1, n, HK, KD), v.reshape(1, n, HV, VD)
    init = ssm_states[[slot]] * float(has_init)
    kwargs = {}
    if block_ends:
        kwargs["checkpoint_chunks"] = tuple(e // CHUNK - 1 for e in block_ends)
    res = gdn.hpu_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=init, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True, chunk_size=CHUNK, prefill_num_seqs=1,
                                         prefill_seq_len=n, **kwargs)
    ssm_states[slot] = res[1][0]
    ckpt = None
    if block_ends:
        ckpt = (res[2][0], gdn.gdn_conv_states_at(x.transpose(0, 1), init_conv, tuple(block_ends)))
    return res[0][0].reshape(n, HV * VD), ckpt


def naive(layer, x, a, b):
    """Token-by-token reference in float64: causal conv + silu, l2norm, gated delta rule."""
    x, w, bias = x.double(), layer.w.double(), layer.bias.double()
    xp = torch.cat([torch.zeros(STATE_LEN, DIM, dtype=torch.float64), x])
    conv = torch.stack([(xp[t:t + WIDTH].transpose(0, 1) * w).sum(-1) for t in range(x.shape[0])]) + bias
    conv = conv * torch.sigmoid(conv)
    q, k, v = torch.split(conv, [HK * KD, HK * KD, HV * VD], dim=-1)
    rep = HV // HK
    q = q.reshape(-1, HK, KD).repeat_interleave(rep, 1)
    k = k.reshape(-1, HK, KD).repeat_interleave(rep, 1)
    v = v.reshape(-1, HV, VD)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    gl = -torch.exp(layer.A_log.double()) * torch.nn.functional.softplus(a.double() + layer.dt_bias.double())
    bt = torch.sigmoid(b.double())
    h = torch.zeros(HV, VD, KD, dtype=torch.float64)
    out = []
    for t in range(x.shape[0]):
        h = h * torch.exp(gl[t]).view(HV, 1, 1)
        v_new = (v[t] - (h * k[t].view(HV, 1, KD)).sum(-1)) * bt[t].view(HV, 1)
        h = h + v_new.unsqueeze(-1) * k[t].view(HV, 1, KD)
        out.append((h * (q[t] * KD**-0.5).view(HV, 1, KD)).sum(-1).reshape(-1))
    return torch.stack(out), h


def states(num_slots):
    return torch.zeros(num_slots, STATE_LEN, DIM), torch.zeros(num_slots, HV, VD, KD)


def maxdiff(x, y):
    return float((x.double() - y.double()).abs().max())


def case(block: int, n_tokens: int, seed: int, patched: bool):
    layer = Layer(seed)
    x, a, b = prompt(n_tokens, seed + 1)
    ref_out, ref_state = naive(layer, x, a, b)
    conv_s, ssm_s = states(4)
    cold_out, _ = run_chunk(layer, x, a, b, conv_s, ssm_s, slot=1, has_init=False)
    cold_state = ssm_s[1].clone()
    row = {"block": block, "tokens": n_tokens, "cold_vs_naive": maxdiff(cold_out, ref_out),
           "cold_state_vs_naive": maxdiff(cold_state, ref_state), "hits": []}
    # Another request's state, left in the slot the hit gets (the pristine runner frees and re-uses slots).
    xo, ao, bo = prompt(block, seed + 7)
    full_blocks = n_tokens // block
    for hit_blocks in range(1, full_blocks + 1):
        hit = hit_blocks * block
        if hit >= n_tokens:
            continue
        rest = slice(hit, n_tokens)
        hit_row = {"hit_tokens": hit, "resumed_tokens": n_tokens - hit}
        # What the pristine runner hands the hit: the private slot (fresh: zeros; or re-used: another request's).
        conv_s, ssm_s = states(4)
        out_zero, _ = run_chunk(layer, x[rest], a[rest], b[rest], conv_s, ssm_s, slot=2, has_init=True)
        run_chunk(layer, xo, ao, bo, conv_s, ssm_s, slot=3, has_init=False)
        out_other, _ = run_chunk(layer, x[rest], a[rest], b[rest], conv_s, ssm_s, slot=3, has_init=True)
        hit_row["private_zero_slot_vs_cold"] = maxdiff(out_zero, cold_out[rest])
        hit_row["private_reused_slot_vs_cold"] = maxdiff(out_other, cold_out[rest])
        if patched:
            # The first request: its prefix (the hit's blocks) as chunks ending on block boundaries, a checkpoint at
            # every block end stored in that GDN block's attention page.
            num_pages = full_blocks + 2
            shape = HPUAttentionBackend.get_kv_cache_shape(num_pages * block // CHUNK + 1, CHUNK, KV_HEADS, HEAD)
            pages = (torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
            page_of_block = {j: j + 1 for j in range(full_blocks)}  # GDN block ids (block 0: vLLM's null block)
            conv_s, ssm_s = states(4)
            pre = slice(0, hit)
            _, (ssm_ck, conv_ck) = run_chunk(layer, x[pre], a[pre], b[pre], conv_s, ssm_s, slot=1, has_init=False,
                                             block_ends=tuple(block * (j + 1) for j in range(hit_blocks)))
            gdn.gdn_write_checkpoints(pages, block, [page_of_block[j] for j in range(hit_blocks)], [ssm_ck, conv_ck])
            # The hit: a new request in its own (re-used, stale) slot; restore the last cached block's checkpoint.
            conv_s, ssm_s = states(4)
            run_chunk(layer, xo, ao, bo, conv_s, ssm_s, slot=3, has_init=False)
            ssm_r, conv_r = gdn.gdn_read_checkpoints(pages, block, [page_of_block[hit_blocks - 1]], [ssm_s, conv_s])
            ssm_s[3], conv_s[3] = ssm_r[0], conv_r[0]
            out_ck, _ = run_chunk(layer, x[rest], a[rest], b[rest], conv_s, ssm_s, slot=3, has_init=True)
            hit_row["checkpoint_vs_cold"] = maxdiff(out_ck, cold_out[rest])
            hit_row["checkpoint_vs_naive"] = maxdiff(out_ck, ref_out[rest])
            hit_row["checkpoint_final_state_vs_cold"] = maxdiff(ssm_s[3], cold_state)
            hit_row["checkpoint_bytes"] = gdn.gdn_checkpoint_nbytes([ssm_s, conv_s])
            hit_row["page_bytes"] = 2 * block * KV_HEADS * HEAD * 2
        row["hits"].append(hit_row)
    return row


def main() -> None:
    patched = hasattr(gdn, "gdn_write_checkpoints")
    cases = [case(384, 2 * 384 + 200, 11, patched), case(1152, 1152 + 300, 23, patched)]
    hits = [h for c in cases for h in c["hits"]]
    wrong = min(min(h["private_zero_slot_vs_cold"], h["private_reused_slot_vs_cold"]) for h in hits)
    cold_ok = all(c["cold_vs_naive"] < TOL and c["cold_state_vs_naive"] < TOL for c in cases)
    if patched:
        worst = max(max(h["checkpoint_vs_cold"], h["checkpoint_vs_naive"], h["checkpoint_final_state_vs_cold"])
                    for h in hits)
        vs_cold = max(max(h["checkpoint_vs_cold"], h["checkpoint_final_state_vs_cold"]) for h in hits)
        vs_naive = max(h["checkpoint_vs_naive"] for h in hits)
        fixed = cold_ok and worst < TOL and wrong > 100 * TOL
        symptom = (f"hits resumed from the checkpoint in the block's attention page: max |resumed - cold| = "
                   f"{vs_cold:.2e} (output and final state), max |resumed - naive| = {vs_naive:.2e}, over "
                   f"{len(hits)} hits (blocks 384 and 1152); from the private slot it would be >= {wrong:.3f}")
    else:
        fixed = False
        worst = None
        symptom = (f"a prefix-cache hit resumes from the request's private GDN slot (no checkpoint exists): "
                   f"max |resumed - cold| >= {wrong:.3f} on every hit ({len(hits)} hits, blocks 384 and 1152)")
    print(json.dumps({"fixed": fixed, "symptom": symptom, "patched_kernel": patched, "cold_matches_naive": cold_ok,
                      "min_wrong_state_error": wrong, "max_checkpoint_error": worst, "tolerance": TOL,
                      "cases": cases}))


if __name__ == "__main__":
    main()
