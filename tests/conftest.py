"""Shared test fixtures."""

import os

import pytest

# Without it wgpu may pick an OpenGL adapter that has neither f16 nor subgroups.
os.environ.setdefault("WGPU_BACKEND_TYPE", "Vulkan")


@pytest.fixture(scope="session")
def device():
    """One wgpu device for the whole session: creating one costs about 0.7 s."""
    from generated._runtime import default_device

    return default_device()
