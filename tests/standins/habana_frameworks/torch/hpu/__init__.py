"""CPU stand-in for `habana_frameworks.torch.hpu` (see the package docstring): only what tested vllm_gaudi modules use;
called only on device paths."""
from __future__ import annotations


def wrap_in_hpu_graph(*args, **kwargs):
    """CPU stand-in: HPU graphs exist only on a Gaudi card; raises when called."""
    raise RuntimeError("CPU stand-in: not available off a Gaudi card")


def synchronize(*args, **kwargs) -> None:
    """CPU stand-in: waits for queued HPU work; CPU tensors are computed synchronously, so there is nothing to wait for."""


class Stream:
    """CPU stand-in for the HPU stream type (named in the model runner's annotations); cannot be made off a Gaudi card."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("CPU stand-in: not available off a Gaudi card")


class Event:
    """CPU stand-in for the HPU event type; cannot be made off a Gaudi card."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("CPU stand-in: not available off a Gaudi card")
