# SPDX-License-Identifier: Apache-2.0
"""Workgroup counts (folded dispatches) and the device limits a plan must fit: workgroup size and
memory, dispatch sizes, buffer and binding sizes, chunk offsets.
"""

from __future__ import annotations

from .caps import features_text
from .errors import ContractError, PlanError
from .numeric import storage_nbytes, ceil_div, whole


def fold_width(caps):
    """The value of DISPATCH_FOLD_WIDTH: shaders rebuild a flat workgroup index from it."""
    # Capped at 65535 so that a plan is the same on every device that reports a larger limit.
    return min(caps.limits["maxComputeWorkgroupsPerDimension"], 65535)


def fold_dispatch(x, y, z, caps, what):
    """Workgroup counts with an x over the fold width folded into y, checked against the device."""
    x, y, z = (whole(v, f"{what} dispatch {axis}") for v, axis in zip((x, y, z), "xyz"))
    if 0 in (x, y, z):
        return (0, 0, 0)
    fold = fold_width(caps)
    if x > fold and y == 1:
        x, y = fold, ceil_div(x, fold)
    limit = caps.limits["maxComputeWorkgroupsPerDimension"]
    for axis, v in zip("xyz", (x, y, z)):
        if not 0 < v <= limit:
            raise PlanError(
                "plan",
                what,
                "maxComputeWorkgroupsPerDimension",
                f"dispatch {axis} = {v} workgroups is outside 1..{limit} (maxComputeWorkgroupsPerDimension)",
            )
    return (x, y, z)


def threads_dispatch(threads, workgroup_size, caps, what):
    """Workgroups for one thread per item, folded like fold_dispatch."""
    return fold_dispatch(ceil_div(whole(threads, what), whole(workgroup_size, what)), 1, 1, caps, what)


WORKGROUP_LIMITS = ("maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX")


def check_pass_limits(op, pass_plan, caps):
    """Refuse a pass the device cannot run.

    wgpu checks workgroup size and workgroup memory only when they are literals; ours come from
    override constants, which reach the driver unchecked.
    """
    subject = f"pass {pass_plan.name}"
    limits = caps.limits
    size = pass_plan.workgroup_size
    if size < 1:
        raise PlanError(op, subject, "workgroup size", f"workgroup size {size} is not positive")
    for name in WORKGROUP_LIMITS:
        if size > limits[name]:
            raise PlanError(op, subject, name, f"workgroup size {size} exceeds {name} = {limits[name]}")
    storage = pass_plan.workgroup_storage_bytes
    if storage > limits["maxComputeWorkgroupStorageSize"]:
        raise PlanError(
            op,
            subject,
            "maxComputeWorkgroupStorageSize",
            f"{storage} bytes of workgroup memory exceed maxComputeWorkgroupStorageSize = "
            f"{limits['maxComputeWorkgroupStorageSize']}",
        )
    # A plan made with other caps may have dispatch sizes this device refuses.
    per_dimension = limits["maxComputeWorkgroupsPerDimension"]
    if any(v > per_dimension for v in pass_plan.dispatch):
        raise PlanError(
            op,
            subject,
            "maxComputeWorkgroupsPerDimension",
            f"dispatch {tuple(pass_plan.dispatch)} exceeds maxComputeWorkgroupsPerDimension = {per_dimension}",
        )
    if pass_plan.uses_subgroups and "subgroups" not in caps.features:
        raise PlanError(op, subject, "subgroups", "the pass uses subgroups and the device lacks the feature")
    check_binding_limits(op, subject, pass_plan, limits)


def check_binding_limits(op, subject, pass_plan, limits):
    """Refuse a pass that binds more buffers, or a larger Params struct, than the device allows:
    wgpu would refuse its pipeline mid-call (and some devices, OpenGL's among them, allow fewer
    storage buffers a stage than WebGPU's default)."""
    storage = sum(b.buffer in ("read-only-storage", "storage") for b in pass_plan.bindings)
    uniform = sum(b.buffer == "uniform" for b in pass_plan.bindings)
    highest = max((b.index for b in pass_plan.bindings), default=-1)
    needs = (
        ("maxBindGroups", 1 if pass_plan.bindings else 0, "bind group"),
        ("maxStorageBuffersPerShaderStage", storage, "storage buffers"),
        ("maxUniformBuffersPerShaderStage", uniform, "uniform buffers"),
        ("maxBindingsPerBindGroup", highest + 1, "bindings in its group"),
        ("maxUniformBufferBindingSize", len(pass_plan.uniform_data) if uniform else 0, "bytes of Params"),
    )
    for name, needed, what in needs:
        if needed > limits[name]:
            raise PlanError(
                op, subject, name, f"the pass needs {needed} {what}, over {name} = {limits[name]}"
            )


def check_binding_sizes(op, plan, caps, names=None):
    """Refuse tensors whose buffers exceed the device's buffer or storage-binding size.

    A chunked plan binds its whole tensors only in pieces, so only maxBufferSize applies to them.
    """
    names = names or {}
    for kind, group in (
        ("input", plan.inputs),
        ("output", plan.outputs),
        ("intermediate", plan.intermediates),
    ):
        limits = (
            ("maxBufferSize",)
            if plan.chunks and kind != "intermediate"
            else ("maxStorageBufferBindingSize", "maxBufferSize")
        )
        for key, (shape, dtype_name) in group.items():
            nbytes = storage_nbytes(shape, dtype_name)
            for name in limits:
                if nbytes > caps.limits[name]:
                    raise ContractError(
                        op,
                        f"{kind} {names.get(key, key)}",
                        name,
                        f"{tuple(shape)} {dtype_name} needs {nbytes} bytes, over {name} = {caps.limits[name]}",
                    )


def check_plan_fits(plan, caps, names=None):
    """Refuse a plan (made for other caps, maybe) that this device cannot run."""
    check_binding_sizes(plan.op, plan, caps, names)
    for pass_plan in plan.passes + tuple(p for c in plan.chunks for p in c.plan.passes):
        check_pass_limits(plan.op, pass_plan, caps)
        check_shader_features(plan, pass_plan, caps, names)
    check_chunk_offsets(plan, caps)


def check_shader_features(plan, pass_plan, caps, names=None):
    """Refuse a pass whose shader enables an extension the device lacks the feature of.

    A plan made for caps that claim a feature (`caps=`, or another device's Caps) has such shaders,
    and wgpu refuses them only when the shader module is made, mid-call.
    """
    for extension, feature in pass_plan.features:
        if feature in caps.features:
            continue
        features = f"(features: {features_text(caps.features)})"
        if feature == "shader-f16":  # the contract's own words for float16 on such a device
            message = (
                f"float16 needs the device feature shader-f16, which this device does not have {features}"
            )
            raise PlanError(plan.op, _f16_subject(plan, pass_plan, names or {}), feature, message)
        raise PlanError(
            plan.op,
            f"pass {pass_plan.name}",
            feature,
            f"the shader enables {extension}, which needs the device feature {feature}; this device "
            f"does not have it {features}",
        )


def _f16_subject(plan, pass_plan, names):
    """An f16 shader serves f16 tensors: the first of them, in the caller's name, as the contract says."""
    for kind, group in (("input", plan.inputs), ("output", plan.outputs)):
        for key, (_, dtype_name) in group.items():
            if dtype_name == "float16":
                return f"{kind} {names.get(key, key)}"
    return f"pass {pass_plan.name}"


def check_chunk_offsets(plan, caps):
    """A plan cut for other caps may bind at offsets this device does not allow."""
    align = caps.limits["minStorageBufferOffsetAlignment"]
    for chunk in plan.chunks:
        for key, (offset, size) in chunk.slices.items():
            if offset % align or size > caps.limits["maxStorageBufferBindingSize"]:
                raise PlanError(
                    plan.op,
                    f"piece of {key}",
                    "minStorageBufferOffsetAlignment",
                    f"the plan binds {size} bytes at offset {offset}, which this device does not allow "
                    f"(minStorageBufferOffsetAlignment = {align}, maxStorageBufferBindingSize = "
                    f"{caps.limits['maxStorageBufferBindingSize']}): plan for this device",
                )
