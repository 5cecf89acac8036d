"""Tensors larger than one storage binding run in pieces (the manifests' `chunking`), or are refused.

Plans are made for a caps= mapping with a small maxStorageBufferBindingSize and run on the test
device, so that the pieces are small; one case runs (1, 128, 1024, 1024) f32 (512 MiB) under the
software driver's own 128 MiB binding limit. Every result is compared with the float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import batch_normalization as bn
from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import skip_group_norm as sgn
from generated._runtime import ContractError, device_caps, default_device

from tests.device_helpers import poisoned_call
from tests.oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    microsoft_group_norm_for_call,
    rng_for,
    seed_note,
    skip_group_norm_for_call,
)


def small_binding(nbytes):
    return {"features": ["shader-f16", "subgroups"], "limits": {"maxStorageBufferBindingSize": nbytes}}


def data(rng, shape, dtype):
    return (rng.standard_normal(shape) * rng.uniform(0.5, 3) + rng.uniform(-4, 4)).astype(dtype)


def bn_case(rng, shape, dtype):
    c = shape[1]
    inputs = {
        "x": data(rng, shape, dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
        "inputMean": rng.uniform(-1, 1, c).astype(dtype),
        "inputVar": rng.uniform(0.1, 2, c).astype(dtype),
    }
    ref = batch_normalization_ref(
        inputs["x"], inputs["scale"], inputs["b"], inputs["inputMean"], inputs["inputVar"]
    )
    return inputs, {}, ref


def gn_case(rng, shape, dtype, num_groups):
    c = shape[1]
    inputs = {
        "x": data(rng, shape, dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "bias": rng.uniform(-1, 1, c).astype(dtype),
    }
    attrs = {"num_groups": num_groups}
    return inputs, attrs, group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], num_groups)


def in_case(rng, shape, dtype):
    c = shape[1]
    inputs = {
        "input": data(rng, shape, dtype),
        "scale": rng.uniform(-2, 2, c).astype(dtype),
        "b": rng.uniform(-1, 1, c).astype(dtype),
    }
    return inputs, {}, instance_normalization_ref(inputs["input"], inputs["scale"], inputs["b"])


CASES = [
    # (op, case maker, shape, extra, binding bytes, expected cut)
    ("bn", bn_case, (6, 4, 16, 16), (), 4 * 4 * 256 * 2, "batch"),
    ("bn", bn_case, (1, 7, 64, 64), (), 3 * 4 * 4096, "channels"),
    ("bn", bn_case, (3, 256), (), 1024, "batch"),
    ("gn", gn_case, (5, 8, 16, 16), (4,), 8 * 4 * 256, "batch"),
    ("gn", gn_case, (1, 12, 32, 32), (6,), 4 * 4 * 1024, "channels"),
    ("gn", gn_case, (2, 12, 32, 32), (3,), 4 * 4 * 1024, "channels"),
    ("in", in_case, (4, 3, 16, 16), (), 3 * 4 * 256, "batch"),
    ("in", in_case, (1, 5, 64, 64), (), 2 * 4 * 4096, "channels"),
]
PACKAGES = {"bn": bn, "gn": gn, "in": inn}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("op,make,shape,extra,limit,cut", CASES, ids=[f"{c[0]}-{c[2]}-{c[5]}" for c in CASES])
def test_chunked_run_matches_the_reference(op, make, shape, extra, limit, cut, dtype, request):
    rng, seed = rng_for(request.node.name)
    inputs, attrs, ref = make(rng, shape, dtype, *extra)
    package = PACKAGES[op]
    caps = small_binding(limit)
    shapes = {k: v.shape for k, v in inputs.items()}
    plan = package.plan(shapes, {"T": np.dtype(dtype).name}, attrs, caps=caps)
    assert len(plan.chunks) > 1 and not plan.passes, plan.explanation
    assert plan.explanation[0].startswith("chunked: ")
    first = plan.chunks[0].plan
    batch_key = next(iter(plan.inputs))
    if cut == "batch":
        assert first.inputs[batch_key][0][0] < shape[0] and first.inputs[batch_key][0][1:] == shape[1:]
    else:
        assert first.inputs[batch_key][0][0] == 1 and first.inputs[batch_key][0][1] < shape[1]
    for chunk in plan.chunks:
        for offset, size in chunk.slices.values():
            assert offset % 256 == 0 and size % 4 == 0 and size <= limit
    result = poisoned_call(package, inputs, attrs=attrs, caps=caps)
    key = package.OUTPUTS[0].key
    assert_close(
        result[key],
        ref,
        dtype,
        f"{op} {shape} {np.dtype(dtype).name} in {len(plan.chunks)} pieces, {seed_note(seed)}",
    )
    numpy_result = package.kernel(inputs, attrs=attrs, caps=caps)[key]
    assert_close(numpy_result, ref, dtype, f"{op} {shape} numpy in and out, {seed_note(seed)}")


@pytest.mark.parametrize("channels_last", [1, 0])
@pytest.mark.parametrize("skip_form", ["full", "nc", "n11c"])
def test_skip_group_norm_runs_in_batch_pieces(channels_last, skip_form, request):
    rng, seed = rng_for(request.node.name)
    n, c, h, w = 4, 8, 8, 8
    x_shape = (n, h, w, c) if channels_last else (n, c, h, w)
    skip_shape = {"full": x_shape, "nc": (n, c), "n11c": (n, 1, 1, c)}[skip_form]
    inputs = {
        "X": data(rng, x_shape, np.float32),
        "gamma": rng.uniform(-2, 2, c).astype(np.float32),
        "beta": rng.uniform(-1, 1, c).astype(np.float32),
        "skip": data(rng, skip_shape, np.float32),
        "bias": rng.uniform(-1, 1, c).astype(np.float32),
    }
    attrs = {"groups": 4, "activation": 1, "channels_last": channels_last}
    caps = small_binding(4 * c * h * w)  # one batch item a piece
    plan = sgn.plan(
        {k: v.shape for k, v in inputs.items()},
        {"T": "float32", "M": "float32"},
        attrs,
        caps=caps,
        outputs=("Y", "S"),
    )
    assert len(plan.chunks) == n, plan.explanation
    result = poisoned_call(sgn, inputs, outputs=("Y", "S"), attrs=attrs, caps=caps)
    y_ref, s_ref = skip_group_norm_for_call(inputs, attrs)
    assert_close(result["Y"], y_ref, np.float32, f"Y in pieces, {seed_note(seed)}")
    assert_close(result["S"], s_ref, np.float32, f"S in pieces, {seed_note(seed)}")


@pytest.mark.parametrize("variant", [None, "split", "fused"])
@pytest.mark.parametrize("channels_last", [1, 0])
def test_microsoft_group_norm_runs_in_batch_pieces(channels_last, variant, request):
    rng, seed = rng_for(request.node.name)
    n, c, h, w = 4, 8, 8, 8
    x_shape = (n, h, w, c) if channels_last else (n, c, h, w)
    inputs = {
        "X": data(rng, x_shape, np.float16),
        "gamma": rng.uniform(-2, 2, c).astype(np.float32),
        "beta": rng.uniform(-1, 1, c).astype(np.float32),
    }
    attrs = {"groups": 4, "activation": 1, "channels_last": channels_last}
    caps = small_binding(2 * c * h * w)  # one batch item a piece
    plan = mgn.plan(
        {k: v.shape for k, v in inputs.items()},
        {"T": "float16", "M": "float32"},
        attrs,
        caps=caps,
        variant=variant,
    )
    assert len(plan.chunks) == n, plan.explanation
    result = poisoned_call(mgn, inputs, outputs=("Y",), attrs=attrs, caps=caps, variant=variant)
    context = f"{variant} channels_last={channels_last} in pieces, {seed_note(seed)}"
    assert_close(result["Y"], microsoft_group_norm_for_call(inputs, attrs), np.float16, context)


def test_microsoft_group_norm_item_larger_than_one_binding_is_refused():
    shapes = {"X": (1, 8, 8, 16), "gamma": (16,), "beta": (16,)}
    with pytest.raises(
        ContractError,
        match=r"com.microsoft GroupNorm-1: input X: .*maxStorageBufferBindingSize = 1024.*cannot cut channels",
    ):
        mgn.plan(
            shapes, {"T": "float32", "M": "float32"}, {"groups": 4, "activation": 0}, caps=small_binding(1024)
        )


def test_a_group_larger_than_one_binding_is_refused_by_name():
    shapes = {"x": (1, 2, 64, 64), "scale": (2,), "bias": (2,)}  # one group of 32 KiB
    with pytest.raises(ContractError) as caught:
        gn.plan(shapes, {"T": "float32"}, {"num_groups": 1}, caps=small_binding(16 * 1024))
    text = str(caught.value)
    assert (
        text.startswith("ai.onnx GroupNormalization-21: input x: ")
        and "maxStorageBufferBindingSize = 16384" in text
    ), text
    assert "smallest piece" in text, text


def test_skip_group_norm_item_larger_than_one_binding_is_refused():
    shapes = {"X": (1, 8, 8, 16), "gamma": (16,), "beta": (16,), "skip": (1, 8, 8, 16)}
    with pytest.raises(
        ContractError,
        match=r"SkipGroupNorm-1: input X: .*maxStorageBufferBindingSize = 1024.*cannot cut channels",
    ):
        sgn.plan(
            shapes, {"T": "float32", "M": "float32"}, {"groups": 4, "activation": 0}, caps=small_binding(1024)
        )


def test_batch_items_off_the_offset_alignment_are_refused():
    # 3 channels of 5 x 5 f32: items start every 300 bytes, off minStorageBufferOffsetAlignment (256),
    # and one item does not fit: the output cannot be bound at any item's offset.
    shapes = {"input": (2, 3, 5, 5), "scale": (3,), "b": (3,)}
    with pytest.raises(ContractError, match="minStorageBufferOffsetAlignment = 256"):
        inn.plan(shapes, {"T": "float32"}, caps=small_binding(200))
    # Items of 300 bytes that fit whole: pieces of 256 / gcd(256, 300) = 64 items keep every offset aligned.
    shapes = {"input": (130, 3, 5, 5), "scale": (3,), "b": (3,)}
    plan = inn.plan(shapes, {"T": "float32"}, caps=small_binding(64 * 300))
    assert [c.plan.inputs["input"][0][0] for c in plan.chunks] == [64, 64, 2]


def test_over_max_buffer_size_is_refused_before_chunking():
    shapes = {"x": (64, 3, 1024, 1024), "scale": (3,), "b": (3,), "inputMean": (3,), "inputVar": (3,)}
    with pytest.raises(ContractError, match=r"input x: .* over the device's maxBufferSize = 268435456"):
        bn.plan(shapes, {"T": "float32"})


def test_512_mib_group_norm_runs_under_the_device_binding_limit(request):
    """(1, 128, 1024, 1024) f32 under the software driver's own 128 MiB storage binding limit."""
    limits = device_caps(default_device()).limits
    nbytes = 128 * 1024 * 1024 * 4
    if not limits["maxStorageBufferBindingSize"] < nbytes <= limits["maxBufferSize"]:
        pytest.skip(f"needs a device whose binding limit is below 512 MiB and buffer limit above: {limits}")
    rng, seed = rng_for(request.node.name)
    x = rng.standard_normal((1, 128, 1024, 1024), dtype=np.float32)
    x += rng.uniform(-3, 3, (1, 128, 1, 1)).astype(np.float32)
    scale = rng.uniform(-2, 2, 128).astype(np.float32)
    bias = rng.uniform(-1, 1, 128).astype(np.float32)
    plan = gn.plan(
        {"x": x.shape, "scale": (128,), "bias": (128,)},
        {"T": "float32"},
        {"num_groups": 32},
        device=default_device(),
    )
    assert len(plan.chunks) >= 4, plan.explanation
    y = gn.kernel({"x": x, "scale": scale, "bias": bias}, attrs={"num_groups": 32})["y"]
    for g in range(32):  # the reference a group at a time: the whole tensor in float64 is 1 GiB
        part = slice(4 * g, 4 * g + 4)
        ref = group_normalization_ref(x[:, part], scale[part], bias[part], 1)
        assert_close(y[:, part], ref, np.float32, f"group {g} of (1, 128, 1024, 1024) f32, {seed_note(seed)}")
