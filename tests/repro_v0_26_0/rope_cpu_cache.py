"""Reproducer for rope-cpu-cache: where the HPU rotary classes build their cos/sin table, and how accurate it is.

The bug needs a Gaudi card (its fp32 cos/sin are wrong for large angles, so a table built on the HPU is wrong from
position about 196K). On the CPU this script shows the two halves of what the payload promises, on the REAL classes
of `vllm_gaudi.ops.hpu_rotary_embedding` built by vLLM 0.26.0's own `__init__`:

1. "built on the CPU": each class is constructed with `torch.device("meta")` as the default device (a stand-in for
   "not the CPU", as the HPU is under the model loader). A TorchFunctionMode records the device of every cos/sin
   evaluated while the table is built. The shipped classes evaluate them on meta; the patched ones on the CPU, and
   the finished buffer must still land on the default device (meta) in the requested dtype.
2. "accurate": each class is constructed on the CPU in fp32 and its table compared, row by row up to position
   262,144 (the seeds' context), with a float64 reference written here from the formulas; every entry must be within
   fp32 rounding of it (|table - ref| <= 2**-24 |ref| + 1e-9).

Prints one JSON line: {"fixed": bool, "symptom": str, "classes": {...}}.
"""
import json
import math
import os
import sys
import types

os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.rotary_embedding.common import (  # noqa: E402
    yarn_find_correction_range, yarn_get_mscale, yarn_linear_ramp_mask)
from vllm.model_executor.layers.rotary_embedding.deepseek_scaling_rope import (  # noqa: E402
    yarn_get_mscale as deepseek_get_mscale)

import vllm_gaudi.ops.hpu_rotary_embedding as hre  # noqa: E402

F64 = torch.float64
POSITIONS = 262144  # table rows every long-context class is built with
D = 16  # rotary_dim: small, so 262,144-row float64 references stay cheap
TOL_REL, TOL_ABS = 2.0**-24, 1e-9


def inv_freq(base, dim=D):
    return 1.0 / (base**(torch.arange(0, dim, 2, dtype=F64) / dim))


def table(t, inv, mscale=1.0):
    freqs = torch.outer(t, inv)
    return torch.cat((freqs.cos() * mscale, freqs.sin() * mscale), dim=-1)


def yarn_inv_freq(base, factor, max_pos, beta_fast=32, beta_slow=1, truncate=True):
    pos = base**(torch.arange(0, D, 2, dtype=F64) / D)
    low, high = yarn_find_correction_range(beta_fast, beta_slow, D, base, max_pos, truncate)
    mask = 1 - yarn_linear_ramp_mask(low, high, D // 2, dtype=F64)
    return (1.0 / (factor * pos)) * (1 - mask) + (1.0 / pos) * mask


def ref_llama3(base, factor, low_ff, high_ff, orig):
    inv = inv_freq(base)
    wave = 2 * math.pi / inv
    smooth = (orig / wave - low_ff) / (high_ff - low_ff)
    scaled = torch.where(wave > orig / low_ff, inv / factor, (1 - smooth) * inv / factor + smooth * inv)
    return table(torch.arange(POSITIONS, dtype=F64), torch.where(wave < orig / high_ff, inv, scaled))


def ref_phi3(base, orig, short, long):
    mscale = math.sqrt(1 + math.log(POSITIONS / orig) / math.log(orig))
    pos = base**(torch.arange(0, D, 2, dtype=F64) / D)
    s = table(torch.arange(orig, dtype=F64), 1.0 / (torch.tensor(short, dtype=F64) * pos), mscale)
    lg = table(torch.arange(POSITIONS, dtype=F64), 1.0 / (torch.tensor(long, dtype=F64) * pos), mscale)
    return torch.cat([s, lg], dim=0)


def ref_llama4_vision(base, rotary_dim, patches):
    inv = inv_freq(base, rotary_dim)[:rotary_dim // 2]
    idx = torch.arange(patches + 1, dtype=torch.int64)
    idx[-1] = -2  # the CLS token row
    side = int(math.sqrt(patches))
    fx = ((idx % side) + 1).to(F64)[:, None] * inv
    fy = ((idx // side) + 1).to(F64)[:, None] * inv
    freqs = torch.cat([fx, fy], dim=-1).masked_fill((idx < 0)[:, None], 0)[:, None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


N4 = POSITIONS // 4
SHORT = [1.0] * (D // 2)
LONG = [1.0 + 0.5 * i for i in range(D // 2)]
# name: (constructor taking the dtype, float64 reference of the whole table, name of the table buffer)
CASES = {
    "HPURotaryEmbedding": (lambda dt: hre.HPURotaryEmbedding(64, D, POSITIONS, 1e6, True, dt),
                           lambda: table(torch.arange(POSITIONS, dtype=F64), inv_freq(1e6)), "cos_sin_cache"),
    "HPULinearScalingRotaryEmbedding":
    (lambda dt: hre.HPULinearScalingRotaryEmbedding(64, D, N4, 1e4, True, [4.0], dt),
     lambda: table(torch.arange(POSITIONS, dtype=F64) / 4.0, inv_freq(1e4)), "cos_sin_cache"),
    "HPUDynamicNTKScalingRotaryEmbedding":
    (lambda dt: hre.HPUDynamicNTKScalingRotaryEmbedding(64, D, POSITIONS, 32768, 1e4, True, 8.0, dt),
     lambda: table(torch.arange(POSITIONS, dtype=F64),
                   inv_freq(1e4 * ((8.0 * POSITIONS / 32768) - 7.0)**(D / (D - 2)))), "cos_sin_cache"),
    "HPUYaRNScalingRotaryEmbedding":
    (lambda dt: hre.HPUYaRNScalingRotaryEmbedding(64, D, N4, 1e6, True, 4.0, dt),
     lambda: table(torch.arange(POSITIONS, dtype=F64), yarn_inv_freq(1e6, 4.0, N4), yarn_get_mscale(4.0)),
     "cos_sin_cache"),
    "HPUDeepseekScalingRotaryEmbedding":
    (lambda dt: hre.HPUDeepseekScalingRotaryEmbedding(64, D, N4, 1e4, False, 4.0, dt, mscale=1.0, mscale_all_dim=0.0),
     lambda: table(torch.arange(POSITIONS, dtype=F64), yarn_inv_freq(1e4, 4.0, N4),
                   deepseek_get_mscale(4.0, 1.0) / deepseek_get_mscale(4.0, 0.0)), "cos_sin_cache"),
    "HPULlama3RotaryEmbedding": (lambda dt: hre.HPULlama3RotaryEmbedding(64, D, POSITIONS, 5e5, True, dt, 8.0, 1.0,
                                                                         4.0, 8192),
                                 lambda: ref_llama3(5e5, 8.0, 1.0, 4.0, 8192), "cos_sin_cache"),
    "HPUPhi3LongRoPEScaledRotaryEmbedding":
    (lambda dt: hre.HPUPhi3LongRoPEScaledRotaryEmbedding(64, D, POSITIONS, 4096, 1e4, True, dt, SHORT, LONG),
     lambda: ref_phi3(1e4, 4096, SHORT, LONG), "long_short_cos_sin_cache"),
    "HPUMRotaryEmbedding": (lambda dt: hre.HPUMRotaryEmbedding(64, D, N4, 1e6, True, dt, mrope_section=[2, 3, 3]),
                            lambda: table(torch.arange(POSITIONS, dtype=F64), inv_freq(1e6)), "cos_sin_cache"),
    "HPUMRotaryEmbedding+YaRN":
    (lambda dt: hre.HPUMRotaryEmbedding(64, D, N4 // 4, 1e6, True, dt, mrope_section=[2, 3, 3], scaling_factor=4.0),
     lambda: table(torch.arange(POSITIONS, dtype=F64), yarn_inv_freq(1e6, 4.0, N4), yarn_get_mscale(4.0)),
     "cos_sin_cache"),
    "HPULlama4VisionRotaryEmbedding": (lambda dt: hre.HPULlama4VisionRotaryEmbedding(88, 44, 576, 1e4, False, dt),
                                       lambda: ref_llama4_vision(1e4, 44, 576), "cos_sin_cache"),
}


class TrigDevices(torch.overrides.TorchFunctionMode):
    """Records the device and dtype of every cos/sin result computed while it is active."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") in ("cos", "sin") and isinstance(out, torch.Tensor):
            self.seen.add(f"{out.device.type}/{str(out.dtype).replace('torch.', '')}")
        return out


def check(name, make, ref, buffer):
    with torch.device("meta"), TrigDevices() as rec:
        on_meta = getattr(make(torch.bfloat16), buffer)
    where = sorted(rec.seen)
    built_on_cpu = bool(where) and all(w.startswith("cpu/") for w in where)
    # HPULlama4VisionRotaryEmbedding's own __init__ replaces the dtype with torch.float (the complex table of vLLM).
    want_dtype = torch.float32 if name == "HPULlama4VisionRotaryEmbedding" else torch.bfloat16
    lands = on_meta.device.type == "meta" and on_meta.dtype == want_dtype

    got = getattr(make(torch.float32), buffer)
    want = ref()
    assert got.shape == want.shape, (name, tuple(got.shape), tuple(want.shape))
    err = (got.to(F64) - want).abs()
    bad = err > TOL_REL * want.abs() + TOL_ABS
    first_bad = int(bad.reshape(bad.shape[0], -1).any(dim=-1).nonzero()[0, 0]) if bad.any() else None
    worst = int(err.reshape(err.shape[0], -1).amax(dim=-1).argmax())
    return {
        "trig_on": where,
        "built_on_cpu": built_on_cpu,
        "buffer_on_default_device": lands,
        "buffer": f"{on_meta.device.type}/{str(on_meta.dtype).replace('torch.', '')}",
        "cpu_table_dtype": str(got.dtype).replace("torch.", ""),
        "rows": int(got.shape[0]),
        "max_err": float(err.max()),
        "max_err_row": worst,
        "first_row_beyond_fp32_rounding": first_bad,
        "accurate": first_bad is None and got.dtype == torch.float32,
    }


def main():
    cfg = VllmConfig(device_config=DeviceConfig(device="cpu"))
    cfg.model_config = types.SimpleNamespace(max_model_len=POSITIONS)  # read by Phi3LongRoPE's __init__ only
    results, problems = {}, []
    with set_current_vllm_config(cfg):
        for name, (make, ref, buffer) in CASES.items():
            r = results[name] = check(name, make, ref, buffer)
            if not r["built_on_cpu"]:
                problems.append(f"{name}: cos/sin table built on {','.join(r['trig_on'])}, not the CPU")
            if not r["buffer_on_default_device"]:
                problems.append(f"{name}: table buffer is {r['buffer']}, not on the default device (meta) in its dtype")
            if not r["accurate"]:
                problems.append(f"{name}: table not within fp32 rounding of float64 (max error {r['max_err']:.3g} "
                                f"at row {r['max_err_row']}, first bad row {r['first_row_beyond_fp32_rounding']})")
    print(json.dumps({
        "fixed": not problems,
        "symptom": "; ".join(problems) if problems else "every HPU rotary class builds its table on the CPU, "
                   "within fp32 rounding of float64 up to position 262,144, then moves it to the default device",
        "module": hre.__file__,
        "classes": results,
    }))


if __name__ == "__main__":
    main()
    sys.exit(0)
