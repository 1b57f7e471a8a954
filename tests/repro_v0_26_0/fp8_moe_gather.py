"""Reproducer for fp8-moe-gather: the gathered-expert FP8 MoE decode path behind VLLM_HPU_MOE_GATHER.

An opt-in backport, not a bug: the pristine module has no gathered path (VLLM_HPU_MOE_GATHER does nothing). The
speed-up, the device graphs and the real FP8 kernel need a Gaudi card; on the CPU this script runs the REAL
`vllm_gaudi.ops.hpu_fp8.HPUFp8MoEMethod` (built by its own `__init__` from vLLM 0.26.0's `Fp8Config` and
`FusedMoEConfig`; `process_weights_after_loading` and `apply_monolithic` run as shipped or patched) on a layer that
carries the attributes vLLM 0.26.0's `RoutedExperts` gives it (a 128x128 block-FP8 checkpoint as Qwen3.5-FP8 ships,
converted to per-channel FP8 by the default VLLM_HPU_FORCE_CHANNEL_FP8, so the stock op is
`VllmMixtureOfExpertsOpFP8PerChannel`).

The HPU kernels are replaced by CPU references, by replacing the attributes the module calls on the
`torch.ops.hpu` namespace (`setattr`, no torch.library registration):
- `cast_to_fp8_v2`: multiply by the scale, clamp to the FP8 range, cast to float8_e4m3fn;
- `fp8_gemm_v2`: dequantize A (per-row scale) and B (per-output-channel scale), matmul in fp32, cast to out_dtype;
- `mixture_of_experts` (the stock fused MoE kernel): for each token and routed expert in experts_min..experts_max,
  the dequantized SiLU-gated MLP in fp32, weighted by the router weight and summed (no intermediate quantization).

Checks, for a card holding all 64 experts (no expert parallelism) and for card 2 of 4 holding experts 128..191 of
256 (expert parallelism: slots routed off the card add nothing there), top_k 8, VLLM_HPU_MOE_GATHER_RATIO=1.0:
- VLLM_HPU_MOE_GATHER unset: the stock op runs at 1 token (off by default);
- VLLM_HPU_MOE_GATHER=1: the gathered path (fp8_gemm_v2 on the gathered experts, no fused MoE call) runs for 1..8
  decode tokens, random routings, and matches the stock path (same inputs, gather off) within MAX_REL per token;
  at 9 tokens (threshold + 1) the stock op runs and the output is bit-identical to the stock path;
- ratio 0.5 maps to 4 tokens;
- VLLM_HPU_MOE_GATHER_VERIFY=1 runs both and passes on the right gather, and raises on a deliberately wrong gather
  (`hpu_moe_combine.gathered_expert_ids` replaced by one returning each id + 1).

Prints one JSON line: {"fixed": bool, "symptom": str, ...}.
"""
import json
import os
import sys

os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for var in ("VLLM_HPU_MOE_GATHER", "VLLM_HPU_MOE_GATHER_RATIO", "VLLM_HPU_MOE_GATHER_VERIFY"):
    os.environ.pop(var, None)

import torch  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402
from vllm.model_executor.layers.fused_moe.config import (  # noqa: E402
    FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType)
from vllm.model_executor.layers.quantization.fp8 import Fp8Config  # noqa: E402

import vllm_gaudi.ops.hpu_fp8 as hpu_fp8  # noqa: E402
from vllm_gaudi.extension.runtime import get_config  # noqa: E402

torch.set_num_threads(1)  # tiny CPU ops: thread start-up and a shared machine cost more than they save
get_config(use_dispatch_fn=False)  # its default reads neural_compressor_pt's version, absent off a Gaudi image

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
H, INTER, TOP_K, BLOCK = 128, 128, 8, 128
MAX_REL = 0.08  # per-token relative L2 error of gathered vs stock (intermediate FP8 rounding; measured ~0.02-0.04)
MAX_REL_MATCHED = 1e-2  # the same, against the reference below that quantizes as the gathered path (bf16 rounding)
CALLS = {"fp8_gemm_v2": 0, "mixture_of_experts": 0}
DEQUANT = {}  # (id(weight), id(scale)) -> (weight, scale, fp32 weight): the stand-in kernel's dequantized experts


def cast_to_fp8_v2(data, scale, stochastic_rounding=False, is_amax=False, dtype=FP8):
    """CPU reference of torch.ops.hpu.cast_to_fp8_v2: data * scale, saturated, as FP8; returns (out, amax)."""
    scaled = (data.float() * torch.as_tensor(scale, dtype=torch.float32)).clamp(-FP8_MAX, FP8_MAX)
    return scaled.to(dtype), scaled.abs().max()


def _per_out_channel(scale, n):
    scale = torch.as_tensor(scale, dtype=torch.float32).reshape(-1)
    return scale.expand(n) if scale.numel() == 1 else scale


def fp8_gemm_v2(A, trans_A, B, trans_B, D, out_dtype, A_scale_inv=None, B_scale_inv=None, bias=None, accumulate=False):
    """CPU reference of torch.ops.hpu.fp8_gemm_v2: dequantize, matmul in fp32, cast to out_dtype."""
    CALLS["fp8_gemm_v2"] += 1
    a = A.float().t() if trans_A else A.float()
    b = B.float().t() if trans_B else B.float()  # [K, N]
    if A_scale_inv is not None:
        a = a * torch.as_tensor(A_scale_inv, dtype=torch.float32)
    if B_scale_inv is not None:
        b = b * _per_out_channel(B_scale_inv, b.shape[1])[None, :]
    out = a @ b
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def _dequant(w, scale):
    hit = DEQUANT.get((id(w), id(scale)))
    if hit is None or hit[0] is not w or hit[1] is not scale:  # the cache holds both, so ids are never reused
        deq = w.float() * (_per_out_channel(scale, w.shape[0])[:, None] if scale is not None else 1.0)
        hit = DEQUANT[(id(w), id(scale))] = (w, scale, deq)
    return hit[2]


def mixture_of_experts(hidden_states, expert_routing_table, router_weights, w12, w3, permuted_weights=True,
                       activation="silu", experts_min=0, experts_max=0, d_scale_hidden_states=None, d_scale_w12=None,
                       d_scale_w3=None, **kwargs):
    """CPU reference of the stock fused MoE kernel torch.ops.hpu.mixture_of_experts (dynamic FP8 form)."""
    CALLS["mixture_of_experts"] += 1
    assert activation == "silu" and permuted_weights, (activation, permuted_weights)
    x = hidden_states.float()
    if d_scale_hidden_states is not None:
        x = x * torch.as_tensor(d_scale_hidden_states, dtype=torch.float32)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
    for e in range(experts_max - experts_min + 1):
        hit = expert_routing_table == experts_min + e  # [T, K]
        if not bool(hit.any()):
            continue
        gate = (router_weights.float() * hit).sum(-1)  # [T]
        w_up = _dequant(w12[e], d_scale_w12[e] if d_scale_w12 is not None else None)
        w_dn = _dequant(w3[e], d_scale_w3[e] if d_scale_w3 is not None else None)
        h = x @ w_up.t()
        act = torch.nn.functional.silu(h[:, :INTER]) * h[:, INTER:]
        out += gate[:, None] * (act @ w_dn.t())
    return out.to(router_weights.dtype)


for _name, _fn in (("cast_to_fp8_v2", cast_to_fp8_v2), ("fp8_gemm_v2", fp8_gemm_v2),
                   ("mixture_of_experts", mixture_of_experts)):
    setattr(torch.ops.hpu, _name, _fn)


def block_fp8(shape, gen):
    """A random 128x128 block-quantized FP8 weight and its scale_inv, as an FP8 checkpoint stores them."""
    w = torch.randn(*shape, generator=gen) * 0.05
    e, m, n = shape
    blocks = w.view(e, m // BLOCK, BLOCK, n // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(2, 4)) / FP8_MAX
    q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(shape)
    return q, scale.float()


def build(num_experts, ep_size, ep_rank, env):
    """The real HPUFp8MoEMethod and a layer with RoutedExperts' attributes, after process_weights_after_loading."""
    for var in ("VLLM_HPU_MOE_GATHER", "VLLM_HPU_MOE_GATHER_RATIO", "VLLM_HPU_MOE_GATHER_VERIFY"):
        os.environ.pop(var, None)
    os.environ.update(env)
    local = num_experts // ep_size
    parallel = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=1, ep_size=ep_size, tp_rank=0, pcp_rank=0,
                                      dp_rank=0, ep_rank=ep_rank, sp_size=1, use_ep=ep_size > 1,
                                      all2all_backend="naive", enable_eplb=False)
    moe = FusedMoEConfig(num_experts=num_experts, experts_per_token=TOP_K, hidden_dim=H, intermediate_size=INTER,
                         num_local_experts=local, num_logical_experts=num_experts, activation=MoEActivation.SILU,
                         device="cpu", routing_method=RoutingMethodType.Renormalize, moe_parallel_config=parallel,
                         in_dtype=torch.bfloat16)
    quant = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic", weight_block_size=[BLOCK, BLOCK])
    layer = torch.nn.Module()
    layer.moe_config, layer.quant_config = moe, quant
    layer.global_num_experts, layer.local_num_experts = num_experts, local
    layer.top_k, layer.activation = TOP_K, MoEActivation.SILU
    layer.use_grouped_topk, layer.custom_routing_function = False, None
    gen = torch.Generator().manual_seed(1000 + ep_rank)
    w13, w13_s = block_fp8((local, 2 * INTER, H), gen)
    w2, w2_s = block_fp8((local, H, INTER), gen)
    for name, t in (("w13_weight", w13), ("w13_weight_scale_inv", w13_s), ("w2_weight", w2),
                    ("w2_weight_scale_inv", w2_s)):
        layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
    method = hpu_fp8.HPUFp8MoEMethod(quant, layer)
    method.process_weights_after_loading(layer)
    return method, layer


def run(method, layer, x, logits):
    CALLS.update(fp8_gemm_v2=0, mixture_of_experts=0)
    out = method.apply_monolithic(layer, x, logits)
    path = "stock" if CALLS["mixture_of_experts"] and not CALLS["fp8_gemm_v2"] else (
        "gathered" if CALLS["fp8_gemm_v2"] and not CALLS["mixture_of_experts"] else "both")
    return out, path


def matched_reference(layer, x, logits):
    """Written here, no gather: for each token and each of its top-k slots on this card, the same FP8 GEMM stand-in
    calls the gathered path makes (x and the SiLU output quantized per row by the module's own dynamic_quant),
    weighted by the router weight (softmax, top-k, renormalized, bf16, as apply_monolithic routes) and summed."""
    weights = torch.softmax(logits.float(), dim=1)
    weights, ids = torch.topk(weights, TOP_K, dim=-1)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
    op = layer.moe_op
    out = torch.zeros(x.shape[0], H, dtype=torch.float32)
    for t in range(x.shape[0]):
        xq, xs = hpu_fp8.hpu_ops.dynamic_quant(x[t:t + 1])
        for k in range(TOP_K):
            e = int(ids[t, k]) - op.experts_min
            if not 0 <= e < op.num_experts:
                continue
            w13, w2 = op.w13_list[e], op.w2_list[e]
            h = fp8_gemm_v2(xq, False, w13.weight.t(), False, None, x.dtype, xs, w13.scale_inv_fp8)
            aq, as_ = hpu_fp8.hpu_ops.dynamic_quant(torch.nn.functional.silu(h[:, :INTER]) * h[:, INTER:])
            y = fp8_gemm_v2(aq, False, w2.weight.t(), False, None, x.dtype, as_, w2.scale_inv_fp8)
            out[t] += weights[t, k].float() * y[0].float()
    return out.to(x.dtype)


def rel_err(a, b):
    d = torch.linalg.vector_norm(a.float() - b.float(), dim=-1)
    return float((d / torch.linalg.vector_norm(b.float(), dim=-1).clamp_min(1e-6)).max())


def main() -> None:
    problems = []
    result = {"fixed": False, "symptom": "", "cards": {}}
    try:
        import vllm_gaudi.ops.hpu_moe_combine as combine
        result["combine_module"] = True
    except ImportError as exc:
        combine = None
        result["combine_module"] = False
        missing = f"vllm_gaudi.ops.hpu_moe_combine: {exc}"
    cards = {"one card, 64 experts": (64, 1, 0), "expert parallel, card 2 of 4 (experts 128..191 of 256)": (256, 4, 2)}
    for card, (num_experts, ep_size, ep_rank) in cards.items():
        got = result["cards"][card] = {}
        stock_m, stock_l = build(num_experts, ep_size, ep_rank, {})
        off_m, off_l = build(num_experts, ep_size, ep_rank, {"VLLM_HPU_MOE_GATHER": "0"})
        on_m, on_l = build(num_experts, ep_size, ep_rank, {"VLLM_HPU_MOE_GATHER": "1",
                                                           "VLLM_HPU_MOE_GATHER_RATIO": "1.0"})
        gen = torch.Generator().manual_seed(7 + ep_rank)
        got["threshold"] = getattr(on_m, "moe_gather_max_tokens", None)
        got["tokens"] = {}
        for tokens in range(1, 10):
            worst, worst_matched, paths, gemms = 0.0, 0.0, set(), set()
            for trial in range(3):
                x = (torch.randn(tokens, H, generator=gen)).to(torch.bfloat16)
                logits = torch.randn(tokens, num_experts, generator=gen).to(torch.bfloat16)
                if trial == 0 and ep_size > 1:  # token 0 routes only off this card: its output here is zero
                    logits[0, ep_rank * (num_experts // ep_size):(ep_rank + 1) * (num_experts // ep_size)] = -30.0
                ref, ref_path = run(stock_m, stock_l, x, logits)
                out, path = run(on_m, on_l, x, logits)
                paths.add(path)
                gemms.add(CALLS["fp8_gemm_v2"])
                if ref_path != "stock":
                    problems.append(f"{card}: the gather-off layer ran {ref_path} at {tokens} tokens")
                if tokens == 9 and not torch.equal(out, ref):
                    problems.append(f"{card}: 9 tokens (threshold + 1) is not the stock op's output")
                worst = max(worst, rel_err(out, ref))
                if tokens <= 8:
                    worst_matched = max(worst_matched, rel_err(out, matched_reference(on_l, x, logits)))
            got["tokens"][tokens] = {"path": sorted(paths), "max_rel_err": worst, "max_rel_err_matched": worst_matched,
                                     "fp8_gemms": sorted(gemms)}
            if tokens <= 8 and gemms != {2 * min(num_experts // ep_size, tokens * TOP_K)}:
                problems.append(f"{card}: {tokens} tokens: {sorted(gemms)} FP8 GEMMs, not 2 per gathered expert "
                                f"(min(E_local, tokens * top_k))")
            want = "gathered" if tokens <= 8 else "stock"
            if paths != {want}:
                problems.append(f"VLLM_HPU_MOE_GATHER=1 ({card}): apply_monolithic ran the {'/'.join(sorted(paths))} "
                                f"MoE op at {tokens} decode token(s), expected {want}")
            if worst > MAX_REL:
                problems.append(f"{card}: {tokens} tokens: gathered vs stock relative error {worst:.4g} > {MAX_REL}")
            if worst_matched > MAX_REL_MATCHED:
                problems.append(f"{card}: {tokens} tokens: gathered vs the matched reference relative error "
                                f"{worst_matched:.4g} > {MAX_REL_MATCHED}")
        x = torch.randn(1, H, generator=gen).to(torch.bfloat16)
        logits = torch.randn(1, num_experts, generator=gen).to(torch.bfloat16)
        got["default_off_path"] = run(off_m, off_l, x, logits)[1]
        if got["default_off_path"] != "stock":
            problems.append(f"{card}: VLLM_HPU_MOE_GATHER=0 ran {got['default_off_path']} at 1 token")
        if ep_size == 1:
            half_m, _ = build(num_experts, ep_size, ep_rank, {"VLLM_HPU_MOE_GATHER": "1",
                                                              "VLLM_HPU_MOE_GATHER_RATIO": "0.5"})
            got["threshold_ratio_0.5"] = getattr(half_m, "moe_gather_max_tokens", None)
            if got["threshold_ratio_0.5"] != 4:
                problems.append(f"{card}: ratio 0.5 maps to {got['threshold_ratio_0.5']} tokens, not 4")
        # VLLM_HPU_MOE_GATHER_VERIFY=1: compares gathered with stock; catches a deliberately wrong gather
        ver_m, ver_l = build(num_experts, ep_size, ep_rank, {"VLLM_HPU_MOE_GATHER": "1",
                                                             "VLLM_HPU_MOE_GATHER_VERIFY": "1"})
        x = torch.randn(4, H, generator=gen).to(torch.bfloat16)
        logits = torch.randn(4, num_experts, generator=gen).to(torch.bfloat16)
        try:
            _, got["verify_path"] = run(ver_m, ver_l, x, logits)
            got["verify_right_gather"] = "passed"
        except RuntimeError as exc:
            got["verify_right_gather"] = f"raised: {exc}"
        if got["verify_right_gather"] != "passed" or got.get("verify_path") != "both":
            problems.append(f"{card}: VERIFY=1 on the right gather: {got['verify_right_gather']}, "
                            f"path {got.get('verify_path')}")
        if combine is not None:
            right = combine.gathered_expert_ids
            combine.gathered_expert_ids = lambda hits, g: (right(hits, g) + 1) % hits.shape[0]
            try:
                wrong_out, _ = run(on_m, on_l, x, logits)
                got["wrong_gather_rel_err"] = rel_err(wrong_out, run(stock_m, stock_l, x, logits)[0])
                run(ver_m, ver_l, x, logits)
                got["verify_wrong_gather"] = "passed"
            except RuntimeError as exc:
                got["verify_wrong_gather"] = f"raised: {exc}"
            finally:
                combine.gathered_expert_ids = right
            if "differs from the stock op" not in got["verify_wrong_gather"]:
                problems.append(f"{card}: VERIFY=1 did not catch a wrong gather: {got['verify_wrong_gather']}")
    if combine is None:
        problems.append(missing)
    result["fixed"] = not problems
    result["symptom"] = "; ".join(problems)
    result["problems"] = problems
    print(json.dumps(result))


if __name__ == "__main__":
    main()
    sys.exit(0)
