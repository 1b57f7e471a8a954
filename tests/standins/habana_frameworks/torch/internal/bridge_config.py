"""CPU stand-in for `habana_frameworks.torch.internal.bridge_config` (imported by the model runner as `bc`)."""
from __future__ import annotations


def env_setting(name, value=None):
    """CPU stand-in: the bridge's settings exist only on a Gaudi card; raises when called."""
    raise RuntimeError("CPU stand-in: not available off a Gaudi card")
