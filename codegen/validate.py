"""Validate stage: every rendered WGSL specialization through naga, on a real wgpu device.

wgpu offers no validation without a device, so the compiler opens one (lavapipe in CI) with
`shader-f16` and subgroups, the features a specialization may use. Naga reports errors
synchronously as `wgpu.GPUValidationError` with line and column; each is mapped to the template
line that wrote that WGSL line through the specialization's `line_map` (made by the render itself),
so this stage reads and renders nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .problems import CompileError, Problem, TemplateLocation
from .wgsl import RenderedPass, Specialization

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
        message = f"the validation adapter ({adapter.info['device']}) lacks {missing}: install Mesa's Vulkan driver and set WGPU_BACKEND_TYPE=Vulkan"
        raise CompileError([Problem(None, message)])
    device = adapter.request_device_sync(required_features=list(VALIDATION_FEATURES))
    return adapter, device


def validate(rendered: list[RenderedPass], device=None, adapter=None) -> ValidationReport:
    """Create a shader module for every specialization; collect every failure, then raise CompileError.
    Without a device, the validation device is opened here (or `device` is the one `adapter` opened)."""
    import wgpu

    if device is None:
        adapter, device = open_validation_device()
    problems, count = [], 0
    for item in rendered:
        for spec in item.specializations:
            count += 1
            try:
                device.create_shader_module(label=f"{item.variant.ir.id}.{item.pass_.ir.id}", code=spec.wgsl)
            except wgpu.GPUValidationError as error:
                problems.append(naga_problem(item, spec, str(error)))
    if problems:
        raise CompileError(problems)
    name = adapter.info["device"] if adapter is not None else "caller's device"
    return ValidationReport(name, count)


def naga_problem(item: RenderedPass, spec: Specialization, message: str) -> Problem:
    """Naga's message at the template line that wrote the WGSL line it names (`wgsl:LINE:COLUMN`)."""
    key = ", ".join(f"{n}={v!r}" for n, v in zip(item.key_names, spec.key))
    head = f"naga rejected variant {item.variant.ir.id}, pass {item.pass_.ir.id}, specialization [{key}]"
    where = TemplateLocation(item.template)
    found = re.search(r":(\d+):(\d+)", message)
    if found:
        line = int(found.group(1))
        body_line = line - spec.body_first_line + 1
        if body_line < 1:
            head += f", in the declarations the compiler writes (WGSL line {line})"
        elif body_line <= len(spec.line_map) and spec.line_map[body_line - 1] is not None:
            where = spec.line_map[body_line - 1]
    return Problem(item.pass_.ir.origin, f"{head}:\n{message}", template=where)
