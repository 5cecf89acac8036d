"""Buffers, usages, caps and values an audit found reaching wgpu or Python's own errors (issue 9):
mapped and mappable buffers, the copy sources of a call in pieces, usages given as strings or that
wgpu would refuse, Tensors over GPU buffers only, caps limits no device can have or with fewer
bindings than a pass needs, a Caps instance checked like a mapping, attributes beyond float's
range, 0-d arrays and iterators as shapes, outputs naming None, the plain functions' output flags,
a buffer destroyed before any Tensor, Tensor dtypes in WGSL's names as plan takes them.

Every one is refused with a ContractError before any GPU work, never a wgpu error or a raw
TypeError / AttributeError from inside the package (tests/runtime/hostile_support.py checks the
refusal's shape). Shapes are tiny: lavapipe is slow.
"""

from __future__ import annotations

import numpy as np
import pytest

import generated
from generated import ContractError, Sequence, Tensor
from generated import group_normalization as gn
from generated import skip_group_norm as sgn
from tests.runtime.hostile_support import ATTRS, SHAPES, gn_arrays, gn_tensors, refusal


# --- buffers, usages, caps and values an audit found reaching wgpu or Python's own errors --------


def mapped_tensor(dtype=np.float32, shape=(2, 4, 3)):
    import wgpu

    device = generated.default_device()
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    buffer = device.create_buffer(size=nbytes, usage=usage, mapped_at_creation=True)
    return Tensor(buffer, shape, dtype, device)


def test_a_mapped_buffer_is_refused_wherever_it_would_be_submitted():
    """A submission that uses a still-mapped buffer aborts wgpu-native (the whole process): as an
    input, as out=, read back, or recorded into a Sequence, it is refused by name first."""
    arrays = gn_arrays()
    cases = {
        "input x": lambda: gn.kernel({**arrays, "x": mapped_tensor()}, attrs=ATTRS),
        "out y": lambda: gn.kernel(gn_tensors(), attrs=ATTRS, out={"y": mapped_tensor()}),
        "numpy()": lambda: mapped_tensor().numpy(),
        "Sequence input x": lambda: Sequence().kernel(
            gn, {**gn_tensors(), "x": mapped_tensor()}, attrs=ATTRS
        ),
    }
    for subject, call in cases.items():
        error = refusal(call)
        assert "is mapped" in error.message and "unmap()" in error.message and error.rule == "unmapped", (
            subject,
            error,
        )


def test_a_call_in_pieces_needs_copy_sources_where_it_copies():
    """A call whose tensors pass maxStorageBufferBindingSize runs in pieces; a cut within a batch
    item copies each piece's per-channel inputs (scale, bias) to aligned scratch, so a scale buffer
    without COPY_SRC is refused up front, naming why, not left to fail in wgpu's finish() (or the
    caller's, with encoder=). X is bound by ranges, never copied: it needs no COPY_SRC, nor does
    any input of a call cut only between batch items."""
    import wgpu

    no_copy_src = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
    attrs = {"num_groups": 6}
    arrays = gn_arrays(shape=(1, 12, 1024))
    caps = {"limits": {"maxStorageBufferBindingSize": 4 * 4 * 1024}}
    plan = gn.plan({k: v.shape for k, v in arrays.items()}, {"T": "float32"}, attrs, caps=caps)
    assert {key for chunk in plan.chunks for key in chunk.copies} == {"scale", "bias"}
    expected = gn.kernel(arrays, attrs=attrs)["y"]
    for key in ("x", "scale"):
        tensors = {
            k: Tensor.from_numpy(v, usage=no_copy_src if k == key else None) for k, v in arrays.items()
        }
        if key == "scale":
            error = refusal(lambda: gn.kernel(tensors, attrs=attrs, caps=caps))
            assert (
                error.subject == "input scale" and "COPY_SRC (the call runs in pieces" in error.message
            ), error
        else:
            np.testing.assert_allclose(
                gn.kernel(tensors, attrs=attrs, caps=caps)["y"].numpy(), expected, rtol=1e-5, atol=1e-5
            )
    batch_cut = gn_arrays(shape=(4, 4, 512))
    batch_caps = {"limits": {"maxStorageBufferBindingSize": 4 * 4 * 512}}
    tensors = {k: Tensor.from_numpy(v, usage=no_copy_src) for k, v in batch_cut.items()}
    np.testing.assert_allclose(
        gn.kernel(tensors, attrs=ATTRS, caps=batch_caps)["y"].numpy(),
        gn.kernel(batch_cut, attrs=ATTRS)["y"],
        rtol=1e-5,
        atol=1e-5,
    )


def test_a_mappable_buffer_is_refused_for_a_call_and_string_usages_are_read(adapter):
    """With wgpu's native mappable-primary-buffers a STORAGE buffer can also be MAP_READ, and a map
    while a recorded call (a repeat of kernel(out=), a Sequence) binds it would abort wgpu-native:
    a call refuses such a buffer. usage= also takes wgpu's "STORAGE | COPY_DST" text."""
    import wgpu

    tensor = Tensor.empty((4,), "float32", usage="STORAGE | COPY_SRC | COPY_DST")
    assert (
        tensor.buffer.usage
        == wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    )
    assert (
        "BufferUsage flags" in refusal(lambda: Tensor.empty((4,), "float32", usage="STORAGE | NOPE")).message
    )
    if "mappable-primary-buffers" not in adapter.features:
        pytest.skip("the adapter has no mappable-primary-buffers")
    device = adapter.request_device_sync(required_features=["mappable-primary-buffers"])
    usage = (
        wgpu.BufferUsage.STORAGE
        | wgpu.BufferUsage.COPY_SRC
        | wgpu.BufferUsage.COPY_DST
        | wgpu.BufferUsage.MAP_READ
    )
    mappable = Tensor(device.create_buffer(size=96, usage=usage), (2, 4, 3), np.float32, device)
    tensors = {k: Tensor.from_numpy(v, device) for k, v in gn_arrays().items()}
    error = refusal(lambda: gn.kernel(tensors, attrs=ATTRS, out={"y": mappable}))
    assert error.rule == "not mappable", error
    error = refusal(lambda: gn.kernel({**tensors, "x": mappable}, attrs=ATTRS))
    assert error.rule == "not mappable" and error.subject == "input x", error


@pytest.mark.parametrize(
    "usage,words",
    [
        (0, "BufferUsage flags"),
        (-1, "BufferUsage flags"),
        (True, "BufferUsage flags"),
        (1 << 12, "BufferUsage flags"),
        (0x81, "mappable"),
    ],
)
def test_tensor_empty_refuses_usages_wgpu_would_refuse(usage, words):
    error = refusal(lambda: Tensor.empty((3,), "float32", usage=usage))
    assert words in error.message, error


def test_tensor_from_numpy_needs_copy_dst_and_keeps_a_0d_shape():
    import wgpu

    error = refusal(lambda: Tensor.from_numpy(np.ones(3, np.float32), usage=wgpu.BufferUsage.STORAGE))
    assert "COPY_DST" in error.message, error
    scalar = Tensor.from_numpy(np.float32(3.5))
    assert scalar.shape == () and scalar.numpy() == np.float32(3.5)


@pytest.mark.parametrize("buffer", [None, "buffer", 3, np.zeros(4)])
def test_a_tensor_is_made_over_a_gpu_buffer_only(buffer):
    error = refusal(lambda: Tensor(buffer, (4,), np.float32, generated.default_device()))
    assert error.subject == "buffer" and type(buffer).__name__ in error.message, error
    tensor = Tensor.from_numpy(np.ones(4, np.float32))
    with pytest.raises(ContractError, match="GPUBuffer"):
        tensor.buffer = buffer


@pytest.mark.parametrize(
    "limits,words",
    [
        ({"maxComputeWorkgroupsPerDimension": 0}, "at least 1"),
        ({"maxComputeInvocationsPerWorkgroup": 0}, "at least 1"),
        ({"minStorageBufferOffsetAlignment": 0}, "power of two"),
        ({"minStorageBufferOffsetAlignment": 3}, "power of two"),
        ({"minUniformBufferOffsetAlignment": 96}, "power of two"),
    ],
)
def test_caps_limits_no_device_can_have_are_refused(limits, words):
    error = refusal(lambda: gn.plan(SHAPES, {"T": "float32"}, ATTRS, caps={"limits": limits}))
    assert words in error.message, error
    assert words in gn.explain(SHAPES, {"T": "float32"}, ATTRS, caps={"limits": limits}).splitlines()[0]


@pytest.mark.parametrize(
    "limits,words",
    [
        ({"maxStorageBuffersPerShaderStage": 1}, "storage buffers, over maxStorageBuffersPerShaderStage = 1"),
        ({"maxBindGroups": 0}, "1 bind group, over maxBindGroups = 0"),
        ({"maxUniformBufferBindingSize": 4}, "bytes of Params, over maxUniformBufferBindingSize = 4"),
        ({"maxBindingsPerBindGroup": 2}, "bindings in its group, over maxBindingsPerBindGroup = 2"),
    ],
)
def test_caps_with_fewer_bindings_than_a_pass_needs_are_refused(limits, words):
    """Limits below WebGPU's defaults exist (OpenGL devices allow 4 storage buffers a stage): a
    pass that binds more than the caps allow is refused by name, not planned for wgpu to refuse
    its pipeline mid-call (an audit found them accepted and ignored)."""
    error = refusal(lambda: gn.plan(SHAPES, {"T": "float32"}, ATTRS, caps={"limits": limits}))
    assert words in error.message, error


def test_a_caps_instance_gets_the_checks_of_a_mapping():
    """dataclasses.replace on a Caps (device_caps() returns one) skipped every check: KeyError,
    ZeroDivisionError and a string of features matched as substrings (an audit found them)."""
    import dataclasses

    from generated._runtime import Caps

    base = Caps.from_mapping({})
    assert dataclasses.replace(base, limits={}).limits == base.limits  # left-out limits: WebGPU's defaults
    for change, words in (
        ({"limits": {"minStorageBufferOffsetAlignment": 0}}, "an alignment is a power of two"),
        ({"limits": {"maxBufferSize": "big"}}, "limits.maxBufferSize"),
        ({"limits": {"maxBufferSise": 4}}, "unknown WebGPU limits: maxBufferSise"),
        ({"features": "shader-f16 subgroups"}, "features must be a list of names"),
    ):
        with pytest.raises(ContractError) as raised:
            dataclasses.replace(base, **change)
        assert words in str(raised.value), (change, raised.value)


@pytest.mark.parametrize("name", ["epsilon", "num_groups"])
def test_an_attribute_beyond_floats_range_is_refused(name):
    attrs = {**ATTRS, name: 10**400}
    error = refusal(lambda: gn.kernel(gn_arrays(), attrs=attrs))
    assert error.subject == f"attribute {name}" and "32-bit" in error.message, error
    assert "32-bit" in gn.explain(SHAPES, {"T": "float32"}, attrs).splitlines()[0]


def test_shapes_that_are_0d_arrays_or_iterators():
    error = refusal(lambda: gn.plan({**SHAPES, "x": np.array(5)}, {"T": "float32"}, ATTRS))
    assert "a shape is a sequence" in error.message, error
    once = gn.plan({**SHAPES, "x": (d for d in SHAPES["x"])}, {"T": "float32"}, ATTRS)
    assert once.variant == gn.plan(SHAPES, {"T": "float32"}, ATTRS).variant  # read once, planned right


def test_outputs_naming_none_is_refused():
    error = refusal(lambda: gn.kernel(gn_arrays(), attrs=ATTRS, outputs=()))
    assert error.subject == "outputs" and "at least one output" in error.message, error


@pytest.mark.parametrize("flag", ["no", 1, None, np.float32(1)])
def test_a_plain_functions_output_flag_is_a_bool(flag):
    """return_sum="no" used to ask for S (any truthy value did); a flag is True or False."""
    x = np.ones((1, 2, 2, 4), np.float32)
    c = np.ones(4, np.float32)
    error = refusal(lambda: sgn.skip_group_norm(x, c, c, x, None, groups=2, activation=0, return_sum=flag))
    assert error.subject == "argument return_sum" and "True or False" in error.message, error
    y, s = sgn.skip_group_norm(x, c, c, x, None, groups=2, activation=0, return_sum=np.bool_(True))
    assert y.shape == s.shape == x.shape


WATCHED_BEFORE_ANY_TENSOR = """
import numpy as np, wgpu
import generated
from generated import group_normalization as gn
device = generated.default_device()  # the package sees a device; no Tensor exists yet
buffer = device.create_buffer(size=2 * 8 * 16 * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
buffer.destroy()
x = generated.Tensor(buffer, (2, 8, 16), np.float32, device)
try:
    gn.kernel({"x": x, "scale": np.ones(8, np.float32), "bias": np.zeros(8, np.float32)}, attrs={"num_groups": 4})
    print("ran")
except generated.ContractError as error:
    print("refused:", error.rule)
"""


def test_a_buffer_destroyed_before_any_tensor_is_known_once_the_device_was_seen():
    """wgpu reports no destroyed state, so the package watches destroy() from the first device it
    sees (here the default one), not from the first Tensor: a fresh process, where no Tensor has
    been made yet, still refuses the destroyed buffer by name (a submission with it can abort)."""
    import os
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", WATCHED_BEFORE_ANY_TENSOR],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert "refused: not destroyed" in child.stdout, (child.stdout, child.stderr[-2000:])


def test_tensor_dtypes_take_the_wgsl_names_as_plan_does():
    """numpy reads "f16" as float128: Tensor.empty((3,), "f16") was refused as "dtype float128"."""
    assert Tensor.empty((3,), "f16").dtype == np.float16
    assert Tensor.empty((3,), "f32").dtype == np.float32
    with pytest.raises(ContractError, match="float32 or float16"):
        Tensor.empty((3,), "f64")
