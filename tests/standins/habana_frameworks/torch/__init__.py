"""CPU stand-in for `habana_frameworks.torch` (see the package docstring): only what tested vllm_gaudi modules use."""
from __future__ import annotations

import os
import types


def _is_lazy() -> bool:
    """CPU stand-in: lazy mode as `PT_HPU_LAZY_MODE` asks for it (the seeds use 0, compile mode, the default)."""
    return os.environ.get("PT_HPU_LAZY_MODE", "0") == "1"


#: CPU stand-in for `habana_frameworks.torch.utils`: `utils.internal.is_lazy()` (read by `vllm_gaudi.utils` on import).
utils = types.SimpleNamespace(internal=types.SimpleNamespace(is_lazy=_is_lazy))
