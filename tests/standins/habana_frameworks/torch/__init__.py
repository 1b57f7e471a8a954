"""CPU stand-in for `habana_frameworks.torch` (see the package docstring): only what tested vllm_gaudi modules use."""
from __future__ import annotations

import os
import types


def _is_lazy() -> bool:
    """CPU stand-in: lazy mode as `PT_HPU_LAZY_MODE` asks for it (the seeds use 0, compile mode, the default)."""
    return os.environ.get("PT_HPU_LAZY_MODE", "0") == "1"


#: CPU stand-in for `habana_frameworks.torch.utils`: `utils.internal.is_lazy()` (read by `vllm_gaudi.utils` on import).
utils = types.SimpleNamespace(internal=types.SimpleNamespace(is_lazy=_is_lazy))

# CPU stand-in: the real package exposes the `torch` module and these submodules as attributes once imported
# (`from habana_frameworks.torch import torch` in `vllm_gaudi.extension.profiler`; `htorch.core.mark_step()` and
# `htorch.hpu...` in the model runner). The `utils` package replaces the namespace above with the same `is_lazy`.
import torch  # noqa: E402
from habana_frameworks.torch import core, hpu, utils  # noqa: E402,F401,F811
# CPU stand-in: importing the real package registers its `hpu` module as `torch.hpu` (vllm_gaudi names
# `torch.hpu.Stream` in class annotations at import time).
if not hasattr(torch, "hpu"):
    torch.hpu = hpu
