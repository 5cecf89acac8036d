# SPDX-License-Identifier: Apache-2.0
"""WebGPU kernels for ONNX normalization operators, compiled ahead of time from manifests.

Each op is a subpackage with `kernel`, `plan`, `explain` and a plain function
(`generated.group_normalization.group_normalization(x, scale, bias, num_groups=...)`). The package
imports only `wgpu` (lazily, at the first GPU call) and `numpy`, and imports itself only
relatively, so a copy can live under any name. `ops()` maps ONNX operator versions to the op
packages; `onnx_nodes.run_node()` runs an ONNX node through them.

Hand-written, like `_runtime/` and the tools beside it; the compiler (`python -m codegen manifests/
generated/`) writes only the files under its "Generated" banner: the op packages, `_ops.py` (which
op packages exist and the ONNX versions each runs) and `REPORT.md`. The op packages load on first
use, so `import generated._runtime` (which the compiler does) never imports generated code.
"""

from __future__ import annotations

import importlib

from ._runtime import (
    ContractError,
    DeviceLostError,
    MemoryStats,
    NoAdapterError,
    ReadBack,
    Sequence,
    Tensor,
    WarmupReport,
    WarmupTask,
    default_device,
    empty_cache,
    memory_stats,
    set_cache_limit,
    set_pipeline_cache_limit,
)
from .registry import OpEntry, find_in, ops_of

__version__ = "0.1.0"  # the distribution's version too (pyproject.toml: [tool.hatch.version])
__all__ = [
    "ContractError",
    "DeviceLostError",
    "MemoryStats",
    "NoAdapterError",
    "OpEntry",
    "ReadBack",
    "Sequence",
    "Tensor",
    "WarmupReport",
    "WarmupTask",
    "__version__",
    "default_device",
    "empty_cache",
    "find_op",
    "memory_stats",
    "op_packages",
    "ops",
    "set_cache_limit",
    "set_pipeline_cache_limit",
    "warmup",
]


def _ops_table():
    """The compiler's `_ops.py`, imported on first use (`from . import _ops` would call `__getattr__`)."""
    return importlib.import_module(f"{__name__}._ops")


def op_packages() -> dict:
    """{name: op package} of every op the compiler generated (`_ops.py`), in manifest order."""
    return {package.__name__.rpartition(".")[2]: package for package in _ops_table().OP_PACKAGES}


def __getattr__(name: str):
    """`generated.group_normalization` without importing it first (PEP 562)."""
    if name in _ops_table().OP_PACKAGE_NAMES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ops_table().OP_PACKAGE_NAMES))


def ops() -> dict:
    """{(domain, op_type, since_version): OpEntry}: every ONNX operator version a package here runs."""
    return ops_of(_ops_table().ENTRIES)


def find_op(domain: str, op_type: str, opset: int | None = None) -> OpEntry | None:
    """The entry that serves `op_type` at the model's `opset` of `domain` ("" is ai.onnx), or None;
    `opset=None` takes the op's newest version."""
    return find_in(_ops_table().ENTRIES, domain, op_type, opset)


def warmup(device=None, *, sweeps: bool = True, wait: bool = True):
    """Create ahead of time, on `device`, the pipelines every variant of every op needs for the shipped
    test and bench cases and, with `sweeps`, for each op's bench.json sweeps (every register bucket,
    fill and workgroup size the register variants reach over the shipped channel groupings), with the
    default tunables. Returns a WarmupReport (pipelines made, requests planned and refused, seconds);
    `wait=False` runs it in a thread of its own and returns a WarmupTask (`.wait()`, `.done()`,
    `.cancel()`) at once, so that an app's calls go on meanwhile. See `_runtime.warmup`.
    """
    from ._runtime import warm_cases

    packages = op_packages().values()
    cases = [(p, importlib.import_module(".cases", p.__name__)) for p in packages]
    return warm_cases(cases, device, sweeps=sweeps, wait=wait)
