"""Fixtures of the runtime tests: the adapter, and devices beside the session's (one without
shader-f16, another for cross-device refusals), made once per module.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def adapter():
    import wgpu

    return wgpu.gpu.request_adapter_sync(power_preference="high-performance")


@pytest.fixture(scope="module")
def device_without_f16(adapter):
    device = adapter.request_device_sync(required_features=[])
    assert "shader-f16" not in device.features
    return device


@pytest.fixture(scope="module")
def other_device(adapter):
    return adapter.request_device_sync(required_features=[])
