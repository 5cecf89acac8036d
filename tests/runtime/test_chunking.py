"""Tensors larger than one storage binding run in pieces (the manifests' `chunking`), or are refused.

Plans are made for a caps= mapping with a small maxStorageBufferBindingSize and run on the test
device, so that the pieces are small; one case runs (1, 128, 1024, 1024) f32 (512 MiB) under the
software driver's own 128 MiB binding limit. Every result is compared with the float64 reference.
The layer family (LayerNormalization, RMSNormalization, SimplifiedLayerNormalization and the two Skip
forms) runs in ranges of rows: every op, dtype and optional input and output, rows on and off the
alignment, a skip repeated over the batch (bound whole, or cut within a batch item), the refusals
where no cut exists, and a device whose own binding limit is small through encoder= and Sequence.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import ContractError, Sequence
from generated import batch_normalization as bn
from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import layer_normalization as ln
from generated import rms_normalization as rms
from generated import simplified_layer_normalization as sln
from generated import skip_group_norm as sgn
from generated import skip_layer_normalization as skln
from generated import skip_simplified_layer_normalization as sksln
from generated._runtime import ContractError, Tensor, device_caps, default_device

from tests.device_helpers import poisoned_call
from tests.oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    microsoft_group_norm_for_call,
    node_reference,
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


def test_batch_items_off_the_offset_alignment_run_through_scratch(request):
    # 3 channels of 5 x 5 f32: items start every 300 bytes, off minStorageBufferOffsetAlignment (256),
    # and one item does not fit. This was refused (issue 25 item 5); the pieces' ranges of input and
    # output are now copied through aligned scratch (copies need only 4 bytes).
    rng, seed = rng_for(request.node.name)
    inputs, attrs, ref = in_case(rng, (2, 3, 5, 5), np.float32)
    caps = small_binding(200)
    plan = inn.plan({k: v.shape for k, v in inputs.items()}, {"T": "float32"}, caps=caps)
    assert len(plan.chunks) == 4 and all("input" in c.copies and "output" in c.copies for c in plan.chunks)
    assert_close(poisoned_call(inn, inputs, caps=caps)["output"], ref, np.float32, seed_note(seed))
    # Items of 300 bytes that fit whole: pieces of 256 / gcd(256, 300) = 64 items keep every offset
    # of the output aligned, bound in place (the input's ranges are copied, as before).
    shapes = {"input": (130, 3, 5, 5), "scale": (3,), "b": (3,)}
    plan = inn.plan(shapes, {"T": "float32"}, caps=small_binding(64 * 300))
    assert [c.plan.inputs["input"][0][0] for c in plan.chunks] == [64, 64, 2]
    assert all("output" in c.slices for c in plan.chunks)


def _random_over_limit_case(rng):
    """(package, case maker, shape, extra) of a random request over a 4 KiB binding in which one
    group of one item fits (so that a cut exists)."""
    op = ["bn", "gn", "in"][int(rng.integers(3))]
    while True:
        n, c = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        spatial = (int(rng.integers(1, 12)), int(rng.integers(1, 12)))
        groups = [g for g in range(1, c + 1) if c % g == 0]
        extra = (groups[int(rng.integers(len(groups)))],) if op == "gn" else ()
        per_group = (c // extra[0] if extra else 1) * spatial[0] * spatial[1] * 4
        total = n * c * spatial[0] * spatial[1] * 4
        if total > 4096 and 2 * per_group <= 4096:
            return op, {"bn": bn_case, "gn": gn_case, "in": in_case}[op], (n, c) + spatial, extra


def test_random_shapes_over_the_binding_limit_all_run(request):
    """Random f32 requests over a 4 KiB binding on a 32-byte alignment, each with a cut (one group
    fits): every one plans, and runs to the float64 reference. About 70 % were refused when only
    inputs could be copied through scratch (issue 25 item 5)."""
    rng, seed = rng_for(request.node.name)
    caps = {"features": ["subgroups"], "limits": {"maxStorageBufferBindingSize": 4096}}
    caps["limits"]["minStorageBufferOffsetAlignment"] = 32
    for _ in range(40):
        op, make, shape, extra = _random_over_limit_case(rng)
        inputs, attrs, ref = make(rng, shape, np.float32, *extra)
        package = PACKAGES[op]
        plan = package.plan({k: v.shape for k, v in inputs.items()}, {"T": "float32"}, attrs, caps=caps)
        assert len(plan.chunks) > 1, (op, shape, extra)
        result = poisoned_call(package, inputs, attrs=attrs, caps=caps)
        key = package.OUTPUTS[0].key
        assert_close(result[key], ref, np.float32, f"{op} {shape} {extra}, {seed_note(seed)}")


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


# ---------------------------------------------------------------------------------------------------------
# The layer family: ranges of rows


LAYER = {"ln": ln, "rms": rms, "sln": sln, "skln": skln, "sksln": sksln}
# The optional outputs each op computes (SkipSimplifiedLayerNormalization refuses its `mean`).
LAYER_OPTIONAL_OUTPUTS = {
    "ln": ("mean", "invStdDev"),
    "rms": (),
    "sln": ("inv_std_var",),
    "skln": ("mean", "inv_std_var", "input_skip_bias_sum"),
    "sksln": ("inv_std_var", "input_skip_bias_sum"),
}
# The inputs of the normalized axes' shape, bound whole in every piece.
LAYER_PARAMETERS = {"scale", "b", "gamma", "beta", "bias"}
# (X's shape, axis): rows over three axes, two and one; normalized axes one, two and three.
LAYER_SHAPES = {
    "ln": ((3, 4, 5, 12), 2),
    "rms": ((6, 5, 24), -1),
    "sln": ((2, 7, 3, 16), -2),
    "skln": ((3, 10, 32), -1),
    "sksln": ((30, 20), -1),
}


def layer_case(rng, op, shape, dtype, optional=True, axis=-1, skip_shape=None):
    """(inputs, attrs) of a layer-family op for X of `shape`: parameters of the normalized shape (from
    `axis`; the hidden axis for the Skip forms), the optional inputs when `optional`."""
    x = data(rng, shape, dtype)
    if op in ("ln", "rms", "sln"):
        normalized = shape[axis:]
        inputs = {"x": x, "scale": rng.uniform(-2, 2, normalized).astype(dtype)}
        if op == "ln" and optional:
            inputs["b"] = rng.uniform(-1, 1, normalized).astype(dtype)
        return inputs, {"axis": axis}
    hidden = shape[-1]
    inputs = {"input": x, "skip": data(rng, skip_shape or shape, dtype)}
    inputs["gamma"] = rng.uniform(-2, 2, hidden).astype(dtype)
    if optional:
        inputs["bias"] = rng.uniform(-1, 1, hidden).astype(dtype)
        if op == "skln":
            inputs["beta"] = rng.uniform(-1, 1, hidden).astype(dtype)
    return inputs, {}


def layer_plan(op, inputs, attrs, caps, outputs):
    package = LAYER[op]
    dtypes = {
        spec.type_var: np.dtype(inputs[spec.key].dtype).name for spec in package.INPUTS if spec.key in inputs
    }
    return package.plan({k: v.shape for k, v in inputs.items()}, dtypes, attrs, caps=caps, outputs=outputs)


def check_layer_call(op, inputs, attrs, caps, outputs, context):
    """Poisoned outputs, then numpy in and out, each output against the float64 definition."""
    package = LAYER[op]
    expected = node_reference(package, inputs, attrs)
    poisoned = poisoned_call(package, inputs, outputs, attrs=attrs, caps=caps)
    plain = package.kernel(inputs, attrs=attrs, caps=caps, outputs=outputs)
    for key in outputs:
        assert_close(poisoned[key], expected[key], poisoned[key].dtype, f"{context} {key}")
        assert_close(plain[key], expected[key], plain[key].dtype, f"{context} {key}, numpy in and out")


@pytest.mark.parametrize("optional", [True, False], ids=["optional", "required-only"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("op", list(LAYER))
def test_layer_family_runs_in_pieces_of_rows(op, dtype, optional, request):
    """X of about four pieces: every output asked for (or Y alone), every optional input given (or none)."""
    rng, seed = rng_for(request.node.name)
    shape, axis = LAYER_SHAPES[op]
    inputs, attrs = layer_case(rng, op, shape, dtype, optional, axis)
    outputs = (LAYER[op].OUTPUTS[0].key,) + (LAYER_OPTIONAL_OUTPUTS[op] if optional else ())
    limit = inputs[next(iter(inputs))].nbytes // 4
    caps = small_binding(limit)
    plan = layer_plan(op, inputs, attrs, caps, outputs)
    assert len(plan.chunks) >= 4 and not plan.passes, plan.explanation
    for chunk in plan.chunks:
        # Everything but the parameters is cut; an output not asked for is not bound at all.
        assert set(chunk.slices) | set(chunk.copies) == set(plan.inputs) - LAYER_PARAMETERS | set(outputs)
        for offset, size in chunk.slices.values():
            assert offset % 256 == 0 and size <= limit
    context = (
        f"{op} {shape} axis {axis} {np.dtype(dtype).name} in {len(plan.chunks)} pieces, {seed_note(seed)}"
    )
    check_layer_call(op, inputs, attrs, caps, outputs, context)


def test_rows_on_the_alignment_are_bound_in_place(request):
    """256-byte rows and statistics of 4 bytes a row: pieces of 64 rows keep every offset on the
    alignment, so nothing goes through scratch."""
    rng, seed = rng_for(request.node.name)
    inputs, attrs = layer_case(rng, "ln", (130, 64), np.float32)
    outputs = ("y", "mean", "invStdDev")
    caps = small_binding(64 * 256)
    plan = layer_plan("ln", inputs, attrs, caps, outputs)
    assert [c.plan.inputs["x"][0] for c in plan.chunks] == [(64, 64), (64, 64), (2, 64)]
    assert all(set(c.slices) == {"x", "y", "mean", "invStdDev"} and not c.copies for c in plan.chunks)
    check_layer_call("ln", inputs, attrs, caps, outputs, f"ln (130, 64) in place, {seed_note(seed)}")


@pytest.mark.parametrize(
    "op, shape, dtype, align",
    [
        ("ln", (40, 33), np.float32, 256),  # 132-byte rows
        ("sln", (24, 9), np.float16, 32),  # 18-byte rows: pieces of an even number of rows
        ("skln", (5, 4, 13), np.float16, 32),  # 26-byte rows
        ("sksln", (3, 8, 7), np.float32, 64),  # 28-byte rows
    ],
)
def test_rows_off_the_alignment_go_through_scratch(op, shape, dtype, align, request):
    rng, seed = rng_for(request.node.name)
    inputs, attrs = layer_case(rng, op, shape, dtype)
    outputs = (LAYER[op].OUTPUTS[0].key,) + LAYER_OPTIONAL_OUTPUTS[op]
    caps = small_binding(inputs[next(iter(inputs))].nbytes // 3)
    caps["limits"]["minStorageBufferOffsetAlignment"] = align
    plan = layer_plan(op, inputs, attrs, caps, outputs)
    assert len(plan.chunks) >= 3 and all(c.copies for c in plan.chunks), plan.explanation
    for chunk in plan.chunks:
        assert all(offset % align == 0 for offset, _ in chunk.slices.values())
        assert all(offset % 4 == 0 and size % 4 == 0 for offset, size in chunk.copies.values())
    context = f"{op} {shape} {np.dtype(dtype).name} on a {align}-byte alignment, {seed_note(seed)}"
    check_layer_call(op, inputs, attrs, caps, outputs, context)


@pytest.mark.parametrize("skip_shape", [(8, 32), (1, 8, 32)], ids=["2d", "batch-1"])
@pytest.mark.parametrize("op", ["skln", "sksln"])
def test_a_skip_repeated_over_the_batch_is_bound_whole_or_cut_within_an_item(op, skip_shape, request):
    """Pieces of whole batch items bind the repeated skip whole (it is the same for every item);
    where one item is over the binding, pieces stay within an item and cut the skip alike."""
    rng, seed = rng_for(request.node.name)
    inputs, attrs = layer_case(rng, op, (5, 8, 32), np.float32, skip_shape=skip_shape)
    outputs = ("output",) + LAYER_OPTIONAL_OUTPUTS[op]
    item = 8 * 32 * 4
    for limit, pieces in ((2 * item, 3), (item // 2, 10)):
        caps = small_binding(limit)
        plan = layer_plan(op, inputs, attrs, caps, outputs)
        assert len(plan.chunks) == pieces, plan.explanation
        first = plan.chunks[0]
        if pieces == 3:  # two items, two, one
            assert first.plan.inputs["input"][0] == (2, 8, 32) and first.plan.inputs["skip"][0] == skip_shape
            assert all("skip" not in c.slices and "skip" not in c.copies for c in plan.chunks)
        else:  # half an item: the skip's rows 0-3, then 4-7, for every item
            assert first.plan.inputs["input"][0] == (1, 4, 32)
            assert first.plan.inputs["skip"][0] == skip_shape[:-2] + (4, 32)
            skip_ranges = [{**c.slices, **c.copies}["skip"] for c in plan.chunks]
            assert skip_ranges == [(0, 512), (512, 512)] * 5
        check_layer_call(
            op, inputs, attrs, caps, outputs, f"{op} skip {skip_shape} limit {limit}, {seed_note(seed)}"
        )


def test_where_rows_cannot_be_cut_the_refusal_names_the_tensor_and_why():
    caps = small_binding(1024)
    # axis 0: the whole tensor is one row.
    with pytest.raises(ContractError) as caught:
        ln.plan({"X": (4, 6, 40), "Scale": (4, 6, 40)}, {"T": "float32"}, {"axis": 0}, caps=caps)
    text = str(caught.value)
    assert text.startswith(
        "ai.onnx LayerNormalization-17: input X: (4, 6, 40) float32 needs 3840 bytes"
    ), text
    assert "maxStorageBufferBindingSize = 1024" in text and "normalized axes start at axis 0" in text, text
    # One row of leading axes of 1.
    with pytest.raises(
        ContractError, match=r"input x: .*= 1024, and it is a single row \(the axes before axis 2 are 1\)"
    ):
        rms.plan({"x": (1, 1, 300), "scale": (300,)}, {"T": "float32", "V": "float32"}, caps=caps)
    # Several rows, one of them alone over the binding.
    with pytest.raises(ContractError) as caught:
        skln.plan({"input": (2, 3, 512), "skip": (3, 512), "gamma": (512,)}, {"T": "float32"}, caps=caps)
    text = str(caught.value)
    assert text.startswith("com.microsoft SkipLayerNormalization-1: input input: (2, 3, 512) float32"), text
    assert "= 1024, and one row alone (2048 bytes) is over it" in text, text
    # A float32 Y (scale's type) of a float16 X: its rows are the widest, and it is the tensor named.
    with pytest.raises(ContractError, match=r"output y: \(4, 400\) float32 .*one row alone \(1600 bytes\)"):
        rms.plan({"x": (4, 400), "scale": (400,)}, {"T": "float16", "V": "float32"}, caps=caps)


def test_a_repeated_skip_whose_items_start_off_four_bytes_is_refused():
    """f16 items of 3 x 5 values start every 30 bytes: a piece within an item (one is over the binding)
    could be neither bound there nor copied (copies move whole 4-byte words)."""
    with pytest.raises(ContractError, match=r"input input: .* do not start on the 4-byte steps a copy needs"):
        sksln.plan(
            {"input": (4, 3, 5), "skip": (3, 5), "gamma": (5,)}, {"T": "float16"}, caps=small_binding(16)
        )


def _random_layer_request(rng):
    """(op, inputs, attrs, outputs, limit) of a random layer-family request over its binding limit,
    with at least two rows' worth of room (so that a cut exists): random rank, axis, skip form, dtype
    (rows of an even length, so that every float16 repeat of a skip starts on 4 bytes, from 2 values:
    then the 8 bytes of statistics the kernels keep a row are the widest), optional inputs and
    outputs."""
    op = list(LAYER)[int(rng.integers(len(LAYER)))]
    dtype = [np.float32, np.float16][int(rng.integers(2))]
    while True:
        rank = int(rng.integers(2, 5)) if op in ("ln", "rms", "sln") else int(rng.integers(2, 4))
        shape = tuple(int(d) for d in rng.integers(1, 8, rank - 1)) + (int(rng.integers(1, 24)) * 2,)
        axis = (
            int(rng.integers(1, rank)) - (rank if rng.integers(2) else 0)
            if op in ("ln", "rms", "sln")
            else -1
        )
        skip_shape = None
        if rank == 3 and op in ("skln", "sksln"):
            skip_shape = [shape, shape[1:], (1,) + shape[1:]][int(rng.integers(3))]
        # A row of float32 Y, or of float16 X and Y (2 bytes) twice, or its 8 bytes of statistics.
        widest = max(int(np.prod(shape[axis:])) * 4, 8)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if nbytes > 2 * widest + 4 and np.prod(shape[:axis]) > 1:
            break
    inputs, attrs = layer_case(rng, op, shape, dtype, bool(rng.integers(2)), axis, skip_shape)
    optional = [k for k in LAYER_OPTIONAL_OUTPUTS[op] if rng.integers(2)]
    limit = int(rng.integers(2 * widest, nbytes)) // 4 * 4
    return op, inputs, attrs, (LAYER[op].OUTPUTS[0].key, *optional), limit


def test_random_layer_requests_over_the_binding_limit_all_run(request):
    """Random layer-family requests over a binding limit between two rows and the whole X, on a
    32-byte alignment: every one runs in pieces to the float64 definition."""
    rng, seed = rng_for(request.node.name)
    for _ in range(40):
        op, inputs, attrs, outputs, limit = _random_layer_request(rng)
        caps = small_binding(limit)
        caps["limits"]["minStorageBufferOffsetAlignment"] = 32
        shapes = {k: v.shape for k, v in inputs.items()}
        assert len(layer_plan(op, inputs, attrs, caps, outputs).chunks) > 1, (op, shapes, attrs, limit)
        check_layer_call(
            op, inputs, attrs, caps, outputs, f"{op} {shapes} {attrs} limit {limit}, {seed_note(seed)}"
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("op", list(LAYER))
def test_rows_whose_statistics_are_over_the_binding_run_in_pieces(op, dtype, request):
    """Rows of one value (two for float16: a row of a (S, H) skip repeat starts on 4 bytes): X and Y
    fit one binding, the 8 bytes of statistics every variant keeps a row (rowScratchBytes) do not,
    so the rows are cut for them, and no piece's statistics pass the limit."""
    rng, seed = rng_for(request.node.name)
    hidden = 1 if dtype == np.float32 else 2
    inputs, attrs = layer_case(rng, op, (3, 100, hidden), dtype)
    outputs = (LAYER[op].OUTPUTS[0].key,) + LAYER_OPTIONAL_OUTPUTS[op]
    limit = 1024  # X: 1200 bytes of f32 or f16; the statistics: 2400
    caps = small_binding(limit)
    caps["limits"]["minStorageBufferOffsetAlignment"] = 32
    plan = layer_plan(op, inputs, attrs, caps, outputs)
    assert len(plan.chunks) >= 3, plan.explanation
    for chunk in plan.chunks:
        for shape, dtype_name in chunk.plan.intermediates.values():
            assert int(np.prod(shape)) * np.dtype(dtype_name).itemsize <= limit
    check_layer_call(op, inputs, attrs, caps, outputs, f"{op} rows of {hidden}, {seed_note(seed)}")


@pytest.mark.parametrize("op", list(LAYER))
def test_every_variant_keeps_at_most_row_scratch_bytes_a_row(op):
    """The manifest's rowScratchBytes bounds what every variant keeps a row in scratch (else a cut
    by it could leave a piece's intermediates over the binding)."""
    package = LAYER[op]
    for candidate in package.CANDIDATES:
        for dtype in (np.float32, np.float16):
            inputs, attrs = layer_case(np.random.default_rng(0), op, (4, 6, 8), dtype)
            try:
                plan = package.plan(
                    {k: v.shape for k, v in inputs.items()},
                    {s.type_var: np.dtype(dtype).name for s in package.INPUTS if s.key in inputs},
                    attrs,
                    caps={"features": ["shader-f16", "subgroups"]},
                    variant=candidate.ID,
                )
            except ContractError:
                continue  # the variant does not take this request
            scratch = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in plan.intermediates.values())
            assert scratch <= 24 * package.CHUNKING.row_scratch_bytes, (op, candidate.ID, dtype)


@pytest.fixture(scope="module")
def small_binding_device(adapter):
    """A device whose own maxStorageBufferBindingSize is 4 KiB (wgpu keeps a limit asked below the default)."""
    native = {name.replace("-", "").lower(): name for name in adapter.limits}
    limits = {**adapter.limits, native["maxstoragebufferbindingsize"]: 4096}
    features = [f for f in ("shader-f16", "subgroup") if f in adapter.features]
    device = adapter.request_device_sync(required_features=features, required_limits=limits)
    assert device_caps(device).limits["maxStorageBufferBindingSize"] == 4096
    return device


@pytest.mark.parametrize("skip_shape", [(6, 8, 40), (8, 40)], ids=["full", "2d"])
def test_layer_pieces_record_into_an_encoder_and_a_sequence(small_binding_device, skip_shape, request):
    """On a device whose own binding limit is 4 KiB, kernel(encoder=) and Sequence record the pieces'
    copies and dispatches: both give the plain call's bytes, and the float64 definition."""
    device = small_binding_device
    rng, seed = rng_for(request.node.name)
    inputs, attrs = layer_case(rng, "skln", (6, 8, 40), np.float32, skip_shape=skip_shape)  # 7680 bytes
    outputs = ("output", "mean", "inv_std_var", "input_skip_bias_sum")
    shapes = {k: v.shape for k, v in inputs.items()}
    assert len(skln.plan(shapes, {"T": "float32"}, outputs=outputs, device=device).chunks) > 1
    plain = skln.kernel(inputs, outputs=outputs, device=device)
    expected = node_reference(skln, inputs, attrs)
    tensors = {k: Tensor.from_numpy(v, device=device) for k, v in inputs.items()}
    encoder = device.create_command_encoder()
    recorded = skln.kernel(tensors, outputs=outputs, encoder=encoder)
    device.queue.submit([encoder.finish()])
    sequence = Sequence(device)
    replayed = sequence.kernel(skln, tensors, outputs=outputs)
    sequence.run()
    sequence.run()
    for key in outputs:
        context = f"{key}, skip {skip_shape}, {seed_note(seed)}"
        assert_close(plain[key], expected[key], plain[key].dtype, context)
        assert recorded[key].numpy().tobytes() == plain[key].tobytes(), f"encoder= {context}"
        assert replayed[key].numpy().tobytes() == plain[key].tobytes(), f"Sequence {context}"
