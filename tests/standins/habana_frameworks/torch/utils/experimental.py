"""CPU stand-in for `habana_frameworks.torch.utils.experimental` (read at import by `vllm_gaudi.extension.ops`,
`extension.scales` and `extension.environment`)."""
from __future__ import annotations

import enum


class synDeviceType(enum.IntEnum):
    """CPU stand-in for the device-type enum: the two Gaudi generations vllm_gaudi tests for, and no device."""
    synDeviceGaudi2 = 2
    synDeviceGaudi3 = 3
    #: CPU stand-in: no Gaudi card (neither generation matches, as on a CPU host).
    synDeviceTypeInvalid = -1


def _get_device_type() -> synDeviceType:
    """CPU stand-in: there is no Gaudi card here, so no generation matches."""
    return synDeviceType.synDeviceTypeInvalid
