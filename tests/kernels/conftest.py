"""Fixtures of the kernel tests: the default device's caps."""

from __future__ import annotations

import pytest

from generated._runtime import default_device, device_caps


@pytest.fixture(scope="module")
def caps():
    """The default device's capabilities (features, limits, in WebGPU's names), as plan(caps=) takes them."""
    return device_caps(default_device())
