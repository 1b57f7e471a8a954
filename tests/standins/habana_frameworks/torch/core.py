"""CPU stand-in for `habana_frameworks.torch.core` (imported by `vllm_gaudi.extension.ops`, `extension.scales` and the
model runner); its functions are called only on the device paths."""
from __future__ import annotations


def _unavailable(*args, **kwargs):
    raise RuntimeError("CPU stand-in: not available off a Gaudi card")


def mark_step(*args, **kwargs) -> None:
    """CPU stand-in: a lazy-mode graph break; there is no graph to break on a CPU, so it does nothing."""


def hpu_inference_set_env(*args, **kwargs):
    """CPU stand-in: raises (device set-up, only on a Gaudi card)."""
    _unavailable()


def hpu_initialize(*args, **kwargs):
    """CPU stand-in: raises (device set-up, only on a Gaudi card)."""
    _unavailable()
