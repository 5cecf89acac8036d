"""Validate stage: every rendered WGSL specialization through naga, on a real wgpu device.

wgpu offers no validation without a device, so the compiler opens one (lavapipe in CI) with
`shader-f16` and subgroups, the features a specialization may use. Naga reports errors
synchronously as `wgpu.GPUValidationError` with line and column; each is mapped back to the
template line that produced it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .manifest import ManifestError
from .wgsl import RenderedPass, template_line

VALIDATION_FEATURES = ("shader-f16", "subgroup")


@dataclass(frozen=True)
class ValidationReport:
    adapter: str
    shaders: int


def open_validation_device():
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    missing = [f for f in VALIDATION_FEATURES if f not in adapter.features]
    if missing:
        raise ManifestError([f"the validation adapter ({adapter.info['device']}) lacks {missing}: install Mesa's Vulkan driver and set WGPU_BACKEND_TYPE=Vulkan"])
    device = adapter.request_device_sync(required_features=list(VALIDATION_FEATURES))
    return adapter, device


def validate(rendered: list[RenderedPass], templates_dir: Path, device=None) -> ValidationReport:
    """Create a shader module for every specialization; collect every failure, then raise."""
    import wgpu

    adapter = None
    if device is None:
        adapter, device = open_validation_device()
    problems, count = [], 0
    for item in rendered:
        for spec in item.specializations:
            count += 1
            try:
                device.create_shader_module(label=f"{item.variant.ir.id}.{item.pass_.ir.id}", code=spec.wgsl)
            except wgpu.GPUValidationError as error:
                problems.append(_describe(item, spec, str(error), templates_dir))
    if problems:
        raise ManifestError(problems)
    name = adapter.info["device"] if adapter is not None else "caller's device"
    return ValidationReport(name, count)


def _describe(item: RenderedPass, spec, message: str, templates_dir: Path) -> str:
    where = f"{item.template}"
    found = re.search(r":(\d+):(\d+)", message)
    if found:
        line = int(found.group(1))
        body_line = line - spec.body_first_line + 1
        if body_line >= 1:
            source_line = template_line(templates_dir, item.pass_.ir.template, spec.context, body_line)
            if source_line is not None:
                where = f"{item.template}:{source_line}"
        else:
            where = f"{item.template} (generated declarations, line {line})"
    key = ", ".join(f"{n}={v!r}" for n, v in zip(item.key_names, spec.key))
    return f"{where}: naga rejected variant {item.variant.ir.id}, pass {item.pass_.ir.id}, specialization [{key}]:\n{message}"
