"""Hostile calls (issue 9) that may abort the process: Tensors over 0-byte or too small buffers,
buffers without the usages a call needs, out= aliasing an input. They run in child processes,
several cases per child (tests/runtime/hostile_support.py's run_cases_in_children), so an abort fails
its case instead of killing pytest; each case is refused with a ContractError before any GPU work.
Every refusal is checked for its shape (tests/runtime/hostile_support.py's check_refusal): a ContractError
(a ValueError) whose str reads "{op}: {subject}: {message} ..." and carries the rule, naming the op
and the name the caller used for the input or attribute (a bind key like `x` / `b` or an ONNX role
like `X` / `B`), never another exception type, a wgpu error, or a process abort.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import Tensor
from tests.runtime.hostile_support import (
    OP_IDS,
    OPS,
    check_child_refusal,
    describe_outcome,
    emit,
    kernel,
    run_cases_in_children,
    summary,
)


# =========================================================================================================
# Tensors over 0-byte or too small buffers, buffer usages, out= (child processes)

# name -> (op id, kind); each kind is built by _buffer_case in the child.
BUFFER_KINDS = {
    # A Tensor over a 0-byte buffer (today: SIGABRT in wgpu-native), as an input under its bind
    # key, as an input under its ONNX role, and as out=.
    "zero_bytes_input": OP_IDS,
    "zero_bytes_input_by_role": ("bn", "in"),
    "zero_bytes_out": ("gn", "bn"),
    # A Tensor whose buffer is smaller than its shape's bytes (today: a silent wrong answer).
    "small_buffer_input": OP_IDS,
    "small_buffer_param": ("gn", "sgn", "mgn"),
    "small_buffer_out": OP_IDS,
    # Usages: inputs need STORAGE; out= needs STORAGE and COPY_SRC.
    "input_without_storage": OP_IDS,
    "out_without_copy_src": OP_IDS,
    "out_without_storage": ("bn", "sgn", "mgn"),
    # out= aliasing an input: the same Tensor, or another Tensor over the same buffer.
    "out_aliases_input": OP_IDS,
    "out_aliases_input_buffer": ("gn", "in"),
    # Accepted: a Tensor of 0 elements; an input buffer with only STORAGE; out= without COPY_DST.
    "zero_element_tensors_runs": OP_IDS,
    "input_with_storage_only_runs": OP_IDS,
    "out_without_copy_dst_runs": ("bn", "gn"),
}
BUFFER_CASES = {f"{kind}-{op_id}": (op_id, kind) for kind, ops in BUFFER_KINDS.items() for op_id in ops}


def _usage(*names):
    import wgpu

    value = 0
    for name in names:
        value |= getattr(wgpu.BufferUsage, name)
    return value


def _tensor_over(device, nbytes, shape, dtype, usage=("STORAGE", "COPY_SRC", "COPY_DST"), data=None):
    """A Tensor over a buffer of exactly `nbytes` (filled from `data` at creation: no COPY_DST needed)."""
    if data is None:
        buffer = device.create_buffer(size=nbytes, usage=_usage(*usage))
    else:
        raw = np.ascontiguousarray(data).tobytes()
        assert len(raw) == nbytes, (len(raw), nbytes)
        buffer = device.create_buffer_with_data(data=raw, usage=_usage(*usage))
    return Tensor(buffer, shape, dtype, device)


def _buffer_case(op_id, kind, device):
    """Run one buffer case; returns a JSON-able summary of what the call returned."""
    info = OPS[op_id]
    inputs = info.inputs(np.float32)
    first = info.keys[0]
    x = inputs[first]
    out_key = info.out_key
    reference = kernel(info, inputs)[out_key] if kind.endswith("_runs") else None

    if kind == "zero_bytes_input":
        inputs[first] = _tensor_over(device, 0, x.shape, x.dtype)
    elif kind == "zero_bytes_input_by_role":
        key = "b"
        role = info.roles[key]
        value = inputs.pop(key)
        inputs[role] = _tensor_over(device, 0, value.shape, value.dtype)
    elif kind == "zero_bytes_out":
        key = "Y" if op_id == "bn" else out_key  # BatchNormalization's out= by ONNX role
        return summary(kernel(info, inputs, out={key: _tensor_over(device, 0, x.shape, x.dtype)}))
    elif kind == "small_buffer_input":
        inputs[first] = _tensor_over(device, 16, x.shape, x.dtype, data=x.reshape(-1)[:4])
    elif kind == "small_buffer_param":
        key = info.keys[1]
        inputs[key] = _tensor_over(device, 4, inputs[key].shape, inputs[key].dtype, data=inputs[key][:1])
    elif kind == "small_buffer_out":
        return summary(kernel(info, inputs, out={out_key: _tensor_over(device, 16, x.shape, x.dtype)}))
    elif kind == "input_without_storage":
        inputs[first] = _tensor_over(
            device, x.nbytes, x.shape, x.dtype, usage=("COPY_SRC", "COPY_DST"), data=x
        )
    elif kind == "out_without_copy_src":
        out = _tensor_over(device, x.nbytes, x.shape, x.dtype, usage=("STORAGE", "COPY_DST"))
        return summary(kernel(info, inputs, out={out_key: out}))
    elif kind == "out_without_storage":
        out = _tensor_over(device, x.nbytes, x.shape, x.dtype, usage=("COPY_SRC", "COPY_DST"))
        return summary(kernel(info, inputs, out={out_key: out}))
    elif kind == "out_aliases_input":
        inputs[first] = Tensor.from_numpy(x, device)
        return summary(kernel(info, inputs, out={out_key: inputs[first]}))
    elif kind == "out_aliases_input_buffer":
        inputs[first] = Tensor.from_numpy(x, device)
        alias = Tensor(inputs[first].buffer, x.shape, x.dtype, device)
        return summary(kernel(info, inputs, out={out_key: alias}))
    elif kind == "zero_element_tensors_runs":
        axis = info.spatial_axis  # an axis no parameter reads: they keep matching
        shape = x.shape[:axis] + (0,) + x.shape[axis + 1 :]
        empty = {
            k: Tensor.from_numpy(np.empty(shape, x.dtype) if v.shape == x.shape else v, device)
            for k, v in inputs.items()
        }
        result = kernel(info, empty)
        return {
            "summary": summary(result),
            "ok": tuple(result[out_key].shape) == shape and isinstance(result[out_key], Tensor),
        }
    elif kind == "input_with_storage_only_runs":
        inputs[first] = _tensor_over(device, x.nbytes, x.shape, x.dtype, usage=("STORAGE",), data=x)
        got = kernel(info, inputs)[out_key]
        return {"summary": summary(got), "ok": bool(np.array_equal(got, reference))}
    elif kind == "out_without_copy_dst_runs":
        out = _tensor_over(device, x.nbytes, x.shape, x.dtype, usage=("STORAGE", "COPY_SRC"))
        got = kernel(info, inputs, out={out_key: out})[out_key]
        got = got.numpy() if isinstance(got, Tensor) else got
        return {"summary": summary(got), "ok": bool(np.array_equal(got, reference))}
    return summary(kernel(info, inputs))


def child_main(names):
    """Entry point of the child processes run_cases_in_children starts."""
    from generated import default_device

    device = default_device()
    for name in names:
        print("START " + name, flush=True)
        op_id, kind = BUFFER_CASES[name]
        emit(name, describe_outcome(lambda: _buffer_case(op_id, kind, device)))


@pytest.fixture(scope="module")
def buffer_results():
    return run_cases_in_children("tests.runtime.test_hostile_buffers", BUFFER_CASES)


def _buffer_expectation(op_id, kind):
    """(caller's names the error must carry, words it must carry)."""
    info = OPS[op_id]
    first, out = info.keys[0], info.out_key
    return {
        "zero_bytes_input": ((first,), ()),
        "zero_bytes_input_by_role": (("B",), ()),
        "zero_bytes_out": (("Y" if op_id == "bn" else out,), ()),
        "small_buffer_input": ((first,), ()),
        "small_buffer_param": ((info.keys[1],), ()),
        "small_buffer_out": ((out,), ()),
        "input_without_storage": ((first,), ("STORAGE",)),
        "out_without_copy_src": ((out,), ("COPY_SRC",)),
        "out_without_storage": ((out,), ("STORAGE",)),
        "out_aliases_input": ((out, first), ()),
        "out_aliases_input_buffer": ((out, first), ()),
    }[kind]


@pytest.mark.parametrize("name", list(BUFFER_CASES))
def test_tensor_buffers(name, buffer_results):
    op_id, kind = BUFFER_CASES[name]
    result = buffer_results[name]
    if kind.endswith("_runs"):
        assert result["outcome"] == "returned", f"{name}: must run, got {result}"
        assert result["value"]["ok"], f"{name}: wrong result {result['value']}"
        return
    names, words = _buffer_expectation(op_id, kind)
    check_child_refusal(result, OPS[op_id].op, names, words, name)
