# SPDX-License-Identifier: Apache-2.0
"""Running a plan: every check of a call before GPU work, recording it (pipelines, uniforms, scratch,
bind groups, the copies of a chunked plan), encoding, submitting, reading back.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .cache import per_device
from .caps import checked_device, default_device, device_caps
from .errors import ContractError
from .limits import check_plan_fits
from .numeric import storage_nbytes, numel
from .pipelines import bind_passes, BufferSlice, scratch_buffer
from .tensors import check_encoder, check_tensor_buffer, checked_tensor, Tensor


_PIECES_COPY = " (the call runs in pieces, which copy parts of this input)"


def _plan_inputs(plan, inputs, names):
    """The plan's inputs from the caller's values: present, right shape and dtype, one device."""
    missing = [names.get(key, key) for key in plan.inputs if inputs.get(key) is None]
    if missing:
        raise ContractError(
            plan.op, f"input {missing[0]}", "required input", f"required input {missing[0]} is missing"
        )
    values = {key: inputs[key] for key in plan.inputs}
    tensors = [v for v in values.values() if isinstance(v, Tensor)]
    return values, tensors


def _checked_out(plan, out, values, device, names):
    """The `out=` Tensors, each checked: a Tensor, a planned output, the right shape, no aliasing."""
    if not out:
        return {}
    if not isinstance(out, Mapping):
        raise ContractError(
            plan.op, "out", "a mapping", f"out= maps output names to Tensors, got {type(out).__name__}"
        )
    taken = {id(v.buffer): f"input {names.get(k, k)}" for k, v in values.items() if isinstance(v, Tensor)}
    checked = {}
    for key, tensor in out.items():
        subject = f"out {names.get(key, key)}"
        if key not in plan.outputs:
            raise ContractError(
                plan.op, subject, "known output", f"this call writes {', '.join(plan.outputs)}"
            )
        if not isinstance(tensor, Tensor):
            raise ContractError(
                plan.op,
                subject,
                "a Tensor",
                f"out= takes device Tensors to write into, got {type(tensor).__name__}; "
                "pass generated.Tensor.empty(shape, dtype) or leave out= and take the returned array",
            )
        checked_tensor(plan.op, subject, tensor, plan.outputs[key], device)
        check_tensor_buffer(plan.op, subject, tensor, ("STORAGE", "COPY_SRC"))
        other = taken.get(id(tensor.buffer))
        if other is not None and numel(tensor.shape):
            raise ContractError(
                plan.op,
                subject,
                "no aliasing",
                f"its buffer is also {other}: outputs must not overlap inputs or each other",
            )
        taken[id(tensor.buffer)] = subject
        checked[key] = tensor
    return checked


def run_plan(plan, inputs, device=None, out=None, names=None, encoder=None):
    """Run a plan: upload, allocate, encode every pass, submit once, read back.

    Any input a Tensor -> Tensors out without read-back (they chain on the GPU; numpy inputs
    are uploaded); only numpy inputs -> numpy arrays out. `out` maps output keys to Tensors to
    write into instead of fresh ones. With `encoder`, the call is encoded into that GPUCommandEncoder and not submitted: inputs
    must then be Tensors, and Tensors come back. Everything is checked before the first upload;
    `names` maps keys to the caller's names for the messages.
    """
    names = names or {}
    recorder = "encoder=" if encoder is not None else None
    values, out, device, resident = check_call(plan, inputs, device, out, names, recorder, encoder)
    if not plan.passes and not plan.chunks and not resident:
        # Nothing to compute (an empty output): no GPU work at all.
        return {
            key: _empty_result(shape, dtype_name, out.get(key))
            for key, (shape, dtype_name) in plan.outputs.items()
        }
    return _execute(plan, values, device, out, resident, encoder)


def check_call(plan, inputs, device, out, names, recorder=None, encoder=None):
    """Everything a call is checked for before GPU work; (values, out, device, resident).

    `recorder` names what records the call ("encoder=", "Sequence.kernel()"): its inputs must
    all be Tensors; `encoder`, the caller's encoder= it records into, must be able to take it.
    """
    device = checked_device(plan.op, device)
    values, resident_inputs = _plan_inputs(plan, inputs, names)
    # Mixed numpy and Tensor inputs: the numpy ones are uploaded and Tensors come back, so that a
    # chain stays on the GPU once any of its inputs is there.
    resident = bool(resident_inputs)
    if recorder is not None and len(resident_inputs) != len(values):
        numpy_keys = [names.get(k, k) for k, v in values.items() if not isinstance(v, Tensor)]
        raise ContractError(
            plan.op,
            f"input {numpy_keys[0]}",
            "Tensors only",
            f"{recorder} records GPU work, so every input must be a Tensor (Tensor.from_numpy(array))",
        )
    if device is None:
        device = resident_inputs[0].device if resident_inputs else default_device()
    # A call in pieces copies parts of some inputs (per-channel tensors, an (N, C) skip) to aligned
    # scratch: those buffers are copy sources.
    copied = {key for chunk in plan.chunks for key in chunk.copies} if plan.chunks else ()
    for key, value in values.items():
        usages, why = (("STORAGE", "COPY_SRC"), _PIECES_COPY) if key in copied else (("STORAGE",), "")
        checked_tensor(plan.op, f"input {names.get(key, key)}", value, plan.inputs[key], device, usages, why)
    out = _checked_out(plan, out, values, device, names)
    if encoder is not None:
        check_encoder(plan.op, encoder, device)
    checked = per_device(_plans_fit, device, FITTING_PLANS_SIZE)
    if checked.get(id(plan)) is not plan:
        check_plan_fits(plan, device_caps(device), names)
        checked.put(id(plan), plan)  # the plan itself is kept, so its id is never reused meanwhile
    return values, out, device, resident


FITTING_PLANS_SIZE = 1024  # as many as the plan cache holds
_plans_fit = weakref.WeakKeyDictionary()  # device -> LRUCache {id(plan): plan} of plans this device can run


def intermediate_views(plan, device):
    views = {}
    for key, (shape, dtype_name) in plan.intermediates.items():
        nbytes = storage_nbytes(shape, dtype_name)
        views[key] = BufferSlice(scratch_buffer(device, ("intermediate", key), nbytes), 0, nbytes)
    return views


@dataclass(frozen=True)
class BufferCopy:
    source: object
    source_offset: int
    target: object
    size: int


@dataclass(frozen=True)
class RecordedCall:
    """One call ready to encode, as often as wanted: copies first, then its dispatches."""

    label: str
    copies: tuple
    bound: tuple


def record_call(plan, tensors, device):
    """Pipelines, uniforms, scratch and bind groups for a plan over given tensors; no encoding.

    `tensors` maps "input" and "output" to {key: Tensor}.
    """
    label = f"{plan.op} {plan.variant}"
    if not plan.chunks:
        views = {**tensors, "intermediate": intermediate_views(plan, device)}
        bound = bind_passes([p for p in plan.passes if 0 not in p.dispatch], views, device)
        return RecordedCall(label, (), tuple(bound))
    copies, bound = [], []
    for index, chunk in enumerate(plan.chunks):
        views = {"intermediate": intermediate_views(chunk.plan, device)}
        for kind in ("input", "output"):
            views[kind] = {}
            for key, tensor in tensors[kind].items():
                if key in chunk.slices:
                    views[kind][key] = BufferSlice(tensor.buffer, *chunk.slices[key])
                elif key in chunk.copies:
                    offset, size = chunk.copies[key]
                    target = scratch_buffer(device, ("piece", index, key), size)
                    copies.append(BufferCopy(tensor.buffer, offset, target, size))
                    views[kind][key] = BufferSlice(target, 0, size)
                else:
                    views[kind][key] = tensor
        bound += bind_passes([p for p in chunk.plan.passes if 0 not in p.dispatch], views, device)
    return RecordedCall(label, tuple(copies), tuple(bound))


def encode_calls(encoder, calls, label=None):
    """Encode recorded calls: their dispatches in as few compute passes as their copies allow.

    This loop is what `Sequence.run()` costs per recorded op, so it makes only the native calls a
    dispatch needs: no debug group (two native calls each; the pass label names the call), and no
    set_pipeline when the previous dispatch of the pass used the same pipeline (consecutive calls
    of one variant, as in a UNet, share theirs; pipeline state persists within a compute pass).
    """
    compute = None
    for call in calls:
        if call.copies:
            if compute is not None:
                compute.end()
                compute = None
            for c in call.copies:
                encoder.copy_buffer_to_buffer(c.source, c.source_offset, c.target, 0, c.size)
        for item in call.bound:
            if compute is None:
                compute = encoder.begin_compute_pass(label=label or call.label)
                set_pipeline, set_bind_group, dispatch = (
                    compute.set_pipeline,
                    compute.set_bind_group,
                    compute.dispatch_workgroups,
                )
                current = None
            if item.pipeline is not current:
                set_pipeline(item.pipeline)
                current = item.pipeline
            set_bind_group(0, item.bind_group)
            dispatch(*item.dispatch)
    if compute is not None:
        compute.end()


def _empty_result(shape, dtype_name, out_tensor):
    return out_tensor.numpy() if out_tensor is not None else np.empty(shape, dtype_name)


def call_tensors(plan, values, device, out):
    """Inputs as Tensors (numpy ones uploaded) and outputs (out= ones, or fresh); the uploads."""
    uploaded = []
    inputs = {}
    for key, value in values.items():
        if not isinstance(value, Tensor):
            value = Tensor.from_numpy(value, device)
            uploaded.append(value)
        inputs[key] = value
    outputs = {
        key: out.get(key) or Tensor.empty(shape, dtype_name, device)
        for key, (shape, dtype_name) in plan.outputs.items()
    }
    return {"input": inputs, "output": outputs}, uploaded


def submit_call(call, device, encoder, op):
    """Encode a recorded call into the caller's encoder, or into one of ours and submit it."""
    if encoder is not None:
        _encode_into_callers(encoder, call, op)
    elif call.bound:  # empty tensors: nothing to dispatch
        own = device.create_command_encoder(label=call.label)
        encode_calls(own, [call])
        device.queue.submit([own.finish()])


def _encode_into_callers(encoder, call, op):
    """encode_calls into the caller's encoder; one that was finished, or has a pass open, fails the
    call's first command (so nothing of the call is recorded): a ContractError, not wgpu's error. The
    encoder is invalid afterwards whatever we do (WebGPU's rule for a locked or finished encoder),
    and wgpu exposes no state to test first, so the message says so."""
    import wgpu

    try:
        encode_calls(encoder, [call])
    except wgpu.GPUValidationError as error:
        raise ContractError(
            op,
            "encoder",
            "can record",
            "the encoder cannot record the call (was it finished, or is a pass of it still open?); WebGPU "
            f"makes an encoder used that way invalid, so record your work again on a new one: {error}",
        ) from None


def _execute(plan, values, device, out, resident, encoder=None):
    tensors, uploaded = call_tensors(plan, values, device, out)
    try:
        call = record_call(plan, tensors, device)
        submit_call(call, device, encoder, plan.op)
        if resident:
            return dict(tensors["output"])
        results = {key: tensor.numpy() for key, tensor in tensors["output"].items()}
        for key, tensor in tensors["output"].items():
            if key not in out:
                tensor.buffer.destroy()
        return results
    finally:
        # wgpu frees a destroyed buffer only once the submitted work that uses it is done.
        if encoder is None:
            for tensor in uploaded:
                tensor.buffer.destroy()
