"""CPU stand-in for `habana_frameworks.torch.utils` (see the package docstring): only what tested vllm_gaudi modules use."""
from __future__ import annotations

import types

from habana_frameworks.torch import _is_lazy

#: CPU stand-in for `utils.internal`: `is_lazy()` as the parent package's stand-in answers it.
internal = types.SimpleNamespace(is_lazy=_is_lazy)
