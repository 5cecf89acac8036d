"""BatchNormalization-15 (inference) through the generated kernels, against independent oracles.

Every variant x f32/f16 x ranks 2..5 runs on the wgpu device (Mesa's software Vulkan in CI),
with fresh random inputs per run (the seed is printed on failure), outputs poisoned with NaN
before the run, compared with a float64 NumPy reference and with onnxruntime on the CPU.
"""

from __future__ import annotations


import numpy as np
import pytest
from onnx import numpy_helper

from generated import ContractError, Tensor
from generated import batch_normalization as bn
from generated._runtime import default_device, device_caps
from tests.device_helpers import poisoned_call
from tests.oracles import (
    assert_close,
    backend_node_cases,
    batch_normalization_ref,
    onnxruntime_run,
    pytorch_converted_cases,
    rng_for,
    seed_note,
)

F16_CAPS = {"features": ["shader-f16"]}

# (shape, variants that must be able to run it): C, spatial sizes and element counts on both
# sides of 4; the flat variants' vectors straddle channels in (2, 4, 7), (4, 5, 5), (4, 3, 3) and
# (4, 3, 2), and batches (wrapping from the last channel to channel 0) in (4, 3, 1, 1), (4, 5, 5),
# (4, 3, 3) and (4, 3, 2) (planes of 1 to 3 values take the per-lane path, larger ones the
# two-channel one).
# The two vec4 variants take two vectors an invocation for float16 (`pairs`), one for float32.
NCHW4 = {"nchw_inference_vec4"}
FLAT4 = {"flat_inference_vec4"}
# 8 halves a load: float16 only, element counts a multiple of 8, planes of at least 7 values.
HALVES8 = {"flat_inference_halves8"}
SHAPES = [
    ((3, 8), {"nc_inference_vec4", "inference_scalar"} | FLAT4),
    ((5, 6), {"inference_scalar"}),
    ((2, 6), FLAT4 | {"inference_scalar"}),
    ((2, 3, 12), NCHW4 | FLAT4 | HALVES8 | {"inference_scalar"}),
    ((2, 4, 7), FLAT4 | HALVES8 | {"inference_scalar"}),
    ((4, 5, 5), FLAT4 | {"inference_scalar"}),
    ((4, 3, 3), FLAT4 | {"inference_scalar"}),
    ((4, 3, 2), FLAT4 | {"inference_scalar"}),
    ((2, 5, 4, 6), NCHW4 | FLAT4 | HALVES8 | {"inference_scalar"}),
    ((1, 3, 5, 3), {"inference_scalar"}),
    ((4, 3, 1, 1), FLAT4 | {"inference_scalar"}),
    ((2, 3, 2, 3, 4), NCHW4 | FLAT4 | HALVES8 | {"inference_scalar"}),
    ((1, 2, 3, 3, 3), {"inference_scalar"}),
    # pairs: 2 * WORKGROUP_SIZE = 512 vectors per workgroup; 3 * 7 * 100 = 2100 vectors leave a
    # last workgroup whose second halves are partly and wholly out of range.
    ((3, 7, 10, 40), NCHW4 | FLAT4 | HALVES8 | {"inference_scalar"}),
    # 8 halves a load straddling channels and batch items (the last channel wraps to channel 0),
    # with planes of 8 (never straddling), 9, 10 and 49 values (ResNet-50 layer4's 7 x 7).
    ((3, 5, 8), NCHW4 | FLAT4 | HALVES8 | {"inference_scalar"}),
    ((8, 3, 3, 3), FLAT4 | HALVES8 | {"inference_scalar"}),
    ((4, 3, 10), FLAT4 | HALVES8 | {"inference_scalar"}),
    ((2, 16, 7, 7), FLAT4 | HALVES8 | {"inference_scalar"}),
    # planes of 7 values (a load's last lane at most one plane on), and of 6: not the 8-halves variant.
    ((8, 3, 7), FLAT4 | HALVES8 | {"inference_scalar"}),
    ((4, 3, 6), FLAT4 | {"inference_scalar"}),
]
VARIANTS = (
    "inference_scalar",
    "nc_inference_vec4",
    "nchw_inference_vec4",
    "flat_inference_vec4",
    "flat_inference_halves8",
)


def random_inputs(rng, shape, dtype):
    channels = shape[1]
    return {
        "x": (rng.standard_normal(shape) * 3 + 1).astype(dtype),
        "scale": rng.uniform(-2, 2, channels).astype(dtype),
        "b": rng.uniform(-1, 1, channels).astype(dtype),
        "inputMean": rng.uniform(-1, 1, channels).astype(dtype),
        "inputVar": rng.uniform(0.1, 3, channels).astype(dtype),
    }


def run_poisoned(inputs, **kwargs):
    return poisoned_call(bn, inputs, **kwargs)["y"]


def reference(inputs, epsilon):
    return batch_normalization_ref(
        inputs["x"], inputs["scale"], inputs["b"], inputs["inputMean"], inputs["inputVar"], epsilon
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("shape,runs", SHAPES, ids=[str(s) for s, _ in SHAPES])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_against_float64_reference(variant, shape, runs, dtype, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    epsilon = float(rng.choice([1e-5, 1e-3, 0.1]))
    applies = variant in runs and (variant not in HALVES8 or dtype == np.float16)
    if not applies:
        with pytest.raises(ContractError, match="does not apply"):
            bn.kernel(inputs, attrs={"epsilon": epsilon}, variant=variant)
        return
    actual = run_poisoned(inputs, attrs={"epsilon": epsilon}, variant=variant)
    assert_close(
        actual, reference(inputs, epsilon), dtype, f"{variant} {shape} eps={epsilon} {seed_note(seed)}"
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("shape", [s for s, _ in SHAPES], ids=[str(s) for s, _ in SHAPES])
def test_natural_selection_against_onnxruntime(shape, dtype, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    actual = run_poisoned(inputs)
    # ORT's CPU BatchNormalization has no float16 kernel: run it on the same values in float32.
    ort_inputs = {
        name: inputs[key].astype(np.float32)
        for name, key in zip(("X", "scale", "B", "input_mean", "input_var"), inputs)
    }
    (expected,) = onnxruntime_run("BatchNormalization", ort_inputs, {"epsilon": 1e-5}, opset=15)
    assert_close(actual, expected.astype(np.float64), dtype, f"{shape} vs onnxruntime {seed_note(seed)}")


def test_selection_prefers_vector_variants():
    def chosen(shape, dtype="float32"):
        c = shape[1]
        shapes = {"x": shape, "scale": (c,), "b": (c,), "inputMean": (c,), "inputVar": (c,)}
        return bn.plan(shapes, {"T": dtype}, caps=F16_CAPS).variant

    assert chosen((4, 6)) == "flat_inference_vec4"
    assert chosen((5, 6)) == "inference_scalar"
    assert chosen((2, 3, 7, 4)) == "nchw_inference_vec4"
    assert chosen((2, 3, 8, 8), "float16") == "nchw_inference_vec4"  # two vectors an invocation
    # ResNet-50 layer4 in float16: 8 halves a load, ahead of flat_inference_vec4 (pairs).
    assert chosen((32, 2048, 7, 7), "float16") == "flat_inference_halves8"
    assert chosen((8, 3, 7), "float16") == "flat_inference_halves8"
    assert chosen((4, 3, 6), "float16") == "flat_inference_vec4"  # planes under 7 values
    assert chosen((32, 2048, 7, 7)) == "flat_inference_vec4"
    assert chosen((4, 6), "float16") == "flat_inference_vec4"
    for dtype in ("float32", "float16"):
        assert chosen((4, 8), dtype) == "nc_inference_vec4"
        assert chosen((2, 3, 5, 5), dtype) == "inference_scalar"


@pytest.mark.parametrize(
    "variant,shape,workgroup_size,dtype",
    [
        # 300000 elements at 4 invocations a workgroup need 75000 workgroups: folded into y.
        ("inference_scalar", (2, 3, 50000), 4, np.float32),
        # 75000 vectors, one a workgroup.
        ("flat_inference_vec4", (2, 3, 50000), 1, np.float32),
        ("nchw_inference_vec4", (2, 3, 50000), 1, np.float32),
        # float16: 140000 vectors, two a workgroup.
        ("nchw_inference_vec4", (2, 4, 70000), 1, np.float16),
        ("flat_inference_vec4", (2, 4, 70000), 1, np.float16),
    ],
)
def test_dispatch_folds_past_65535_workgroups(variant, shape, workgroup_size, dtype, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    tunables = {"WORKGROUP_SIZE": workgroup_size}
    p = bn.plan(
        {k: v.shape for k, v in inputs.items()},
        {"T": np.dtype(dtype).name},
        tunables=tunables,
        variant=variant,
        caps=F16_CAPS,
    )
    assert p.passes[0].dispatch[:2] == (65535, 2)
    actual = run_poisoned(inputs, variant=variant, tunables=tunables)
    assert_close(actual, reference(inputs, 1e-5), dtype, f"{variant} folded dispatch {seed_note(seed)}")


@pytest.mark.parametrize("dtype", [np.float16], ids=["f16"])  # pairs: float16 only
@pytest.mark.parametrize(
    "shape,workgroup_size",
    [
        # count4 vectors in blocks of 2 * WORKGROUP_SIZE; what the last block holds:
        ((4, 3, 3), 4),  # 9 = 8 + 1: one first half, no second halves
        ((2, 4, 7), 4),  # 14 = 8 + 6: every first half, two second halves
        ((4, 5, 5), 3),  # 25 = 4 * 6 + 1, a workgroup size that is not a power of two
        ((3, 4, 7, 3), 7),  # 63 = 4 * 14 + 7: exactly the first halves
    ],
)
def test_flat_pairs_cover_a_partial_last_block(shape, workgroup_size, dtype, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, dtype)
    tunables = {"WORKGROUP_SIZE": workgroup_size}
    count4 = int(np.prod(shape)) // 4
    assert count4 % (2 * workgroup_size) != 0
    p = bn.plan(
        {k: v.shape for k, v in inputs.items()},
        {"T": np.dtype(dtype).name},
        caps=F16_CAPS,
        tunables=tunables,
        variant="flat_inference_vec4",
    )
    assert p.passes[0].dispatch == (-(-count4 // (2 * workgroup_size)), 1, 1)
    actual = run_poisoned(inputs, variant="flat_inference_vec4", tunables=tunables)
    assert_close(
        actual,
        reference(inputs, 1e-5),
        dtype,
        f"flat pairs {shape} WORKGROUP_SIZE={workgroup_size} {seed_note(seed)}",
    )


def test_halves8_dispatch_folds_past_65535_workgroups(request):
    # 70000 loads of 8 halves, one a workgroup: folded into y.
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 4, 70000), np.float16)
    tunables = {"WORKGROUP_SIZE": 1}
    p = bn.plan(
        {k: v.shape for k, v in inputs.items()},
        {"T": "float16"},
        caps=F16_CAPS,
        tunables=tunables,
        variant="flat_inference_halves8",
    )
    assert p.passes[0].dispatch[:2] == (65535, 2)
    actual = run_poisoned(inputs, variant="flat_inference_halves8", tunables=tunables)
    assert_close(actual, reference(inputs, 1e-5), np.float16, f"halves8 folded dispatch {seed_note(seed)}")


@pytest.mark.parametrize(
    "shape,workgroup_size",
    [
        # count8 loads in workgroups of WORKGROUP_SIZE; the last one is partly out of range:
        ((8, 3, 3, 3), 4),  # 27 = 4 * 6 + 3
        ((4, 3, 10), 7),  # 15 = 7 * 2 + 1, a workgroup size that is not a power of two
        ((5, 8, 9), 16),  # 45 = 16 * 2 + 13
    ],
)
def test_halves8_covers_a_partial_last_workgroup(shape, workgroup_size, request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, shape, np.float16)
    tunables = {"WORKGROUP_SIZE": workgroup_size}
    count8 = int(np.prod(shape)) // 8
    assert count8 % workgroup_size != 0
    p = bn.plan(
        {k: v.shape for k, v in inputs.items()},
        {"T": "float16"},
        caps=F16_CAPS,
        tunables=tunables,
        variant="flat_inference_halves8",
    )
    assert p.passes[0].dispatch == (-(-count8 // workgroup_size), 1, 1)
    actual = run_poisoned(inputs, variant="flat_inference_halves8", tunables=tunables)
    assert_close(
        actual,
        reference(inputs, 1e-5),
        np.float16,
        f"halves8 {shape} WORKGROUP_SIZE={workgroup_size} {seed_note(seed)}",
    )


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"nc_inference_vec4"}))
def test_f16_results_past_the_f16_range_are_infinite(variant, request):
    """ONNX in float16 rounds a result beyond 65504 to +-inf: so do the kernels (f32 math, one
    rounding at the store), anywhere in a vector or an 8-half load, and the finite ones stay right.
    WGSL lets an implementation assume that nothing overflows (and calls pack2x16float's result
    indeterminate past the f16 range), so this holds on the drivers tested (lavapipe here, the
    H200's), not by the spec; the test keeps it from regressing there."""
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 16, 8, 8), np.float16)
    inputs.update(
        scale=np.full(16, 4, np.float16),
        b=np.zeros(16, np.float16),
        inputMean=np.zeros(16, np.float16),
        inputVar=np.ones(16, np.float16),
    )
    flat = inputs["x"].reshape(-1)
    spots = rng.choice(flat.size, 12, replace=False)
    flat[spots] = np.where(np.arange(12) % 2 == 0, 60000.0, -60000.0).astype(np.float16)
    expected = reference(inputs, 1e-5)
    actual = run_poisoned(inputs, variant=variant).reshape(-1)
    assert np.array_equal(
        actual[spots], np.sign(expected.reshape(-1)[spots]) * np.inf
    ), f"{variant} {seed_note(seed)}"
    finite = np.ones(flat.size, bool)
    finite[spots] = False
    assert_close(actual[finite], expected.reshape(-1)[finite], np.float16, f"{variant} {seed_note(seed)}")


def test_fold_width_stays_65535_on_devices_reporting_more():
    shapes = {"x": (1, 1, 65536 * 256 + 1), "scale": (1,), "b": (1,), "inputMean": (1,), "inputVar": (1,)}
    caps = {
        "limits": {
            "maxComputeWorkgroupsPerDimension": 1 << 20,
            "maxStorageBufferBindingSize": 1 << 30,
            "maxBufferSize": 1 << 30,
        }
    }
    p = bn.plan(shapes, {"T": "float32"}, caps=caps)
    assert p.passes[0].dispatch == (65535, 2, 1)
    assert p.passes[0].overrides["DISPATCH_FOLD_WIDTH"] == 65535


def test_plan_touches_no_gpu_and_reports_values():
    shapes = {"x": (32, 256, 56, 56), "scale": (256,), "b": (256,), "inputMean": (256,), "inputVar": (256,)}
    p = bn.plan(shapes, {"T": "float16"}, attrs={"epsilon": 1e-3}, caps=F16_CAPS)
    (main,) = p.passes
    assert p.variant == "nchw_inference_vec4"
    assert main.uniforms == {
        "count4": 32 * 256 * 56 * 56 // 4,
        "spatial4": 56 * 56 // 4,
        "channels": 256,
        "epsilon": 1e-3,
    }
    assert main.dispatch == (32 * 256 * 56 * 56 // 8 // 256, 1, 1)
    assert main.overrides == {"DISPATCH_FOLD_WIDTH": 65535, "WORKGROUP_SIZE": 256}
    assert p.outputs == {"y": ((32, 256, 56, 56), "float16")}
    assert "enable f16;" in main.wgsl and "array<vec4<f16>>" in main.wgsl


def test_device_tensors_chain_without_read_back(request):
    rng, seed = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 4, 3, 5), np.float32)
    resident = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    first = bn.kernel(resident)["y"]
    assert isinstance(first, Tensor)
    second = bn.kernel({**resident, "x": first})["y"]
    once = reference(inputs, 1e-5)
    twice = batch_normalization_ref(
        once, inputs["scale"], inputs["b"], inputs["inputMean"], inputs["inputVar"], 1e-5
    )
    assert_close(second.numpy(), twice, np.float32, f"chained calls {seed_note(seed)}")


def test_pipelines_are_cached_by_override_values(request):
    from generated._runtime import pipeline_for

    rng, _ = rng_for(request.node.name)
    inputs = random_inputs(rng, (2, 3, 5), np.float32)
    p = bn.plan({k: v.shape for k, v in inputs.items()}, {"T": "float32"})
    device = default_device()
    assert pipeline_for(device, p.passes[0]) is pipeline_for(device, p.passes[0])


# --- the ONNX backend node tests -----------------------------------------------------------------


def _node_cases():
    return backend_node_cases("test_batchnorm") + pytorch_converted_cases("test_BatchNorm")


@pytest.mark.parametrize("case", _node_cases(), ids=lambda c: c[0])
def test_onnx_backend_node_cases(case):
    name, model, data_sets = case
    node = model.graph.node[0]
    attrs = {a.name: (a.f if a.type == a.FLOAT else a.i) for a in node.attribute}
    # The PyTorch exports use BatchNormalization-6/7 attributes; these values mean inference
    # over axis 1, which is what BatchNormalization-15 computes.
    assert attrs.pop("is_test", 1) == 1 and attrs.pop("spatial", 1) == 1, attrs
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    fed = [i.name for i in model.graph.input if i.name not in initializers]
    keys = ("x", "scale", "b", "inputMean", "inputVar")
    for inputs, outputs in data_sets:
        values = {**initializers, **dict(zip(fed, inputs))}
        feed = {key: values[onnx_name] for key, onnx_name in zip(keys, node.input)}
        if attrs.get("training_mode", 0) == 1:
            with pytest.raises(ContractError, match="training_mode"):
                bn.kernel(feed, attrs=attrs)
            continue
        actual = bn.kernel(feed, attrs=attrs)["y"]
        assert_close(actual, np.asarray(outputs[0], np.float64), feed["x"].dtype, name)


# --- contract errors, each before any GPU work -----------------------------------------------------


def good(dtype=np.float32, shape=(2, 3, 4)):
    c = shape[1]
    return {
        "x": np.ones(shape, dtype),
        "scale": np.ones(c, dtype),
        "b": np.ones(c, dtype),
        "inputMean": np.zeros(c, dtype),
        "inputVar": np.ones(c, dtype),
    }


@pytest.mark.parametrize(
    "change,attrs,subject,words",
    [
        ({"x": np.ones((2, 3), np.float64)}, {}, "input x", "float64 is not supported"),
        ({"scale": np.ones(3, np.float16)}, {}, "input scale", "every T tensor must share one dtype"),
        ({"x": np.ones(3, np.float32)}, {}, "input x", "ranks.X >= 2"),
        ({"scale": np.ones(4, np.float32)}, {}, "input scale", "dim(shapes.scale, 0) == dim(shapes.X, 1)"),
        ({"b": np.ones((3, 1), np.float32)}, {}, "input b", "ranks.B == 1"),
        ({"inputMean": np.ones(2, np.float32)}, {}, "input inputMean", "dim(shapes.input_mean, 0)"),
        ({"inputVar": np.ones((1, 3), np.float32)}, {}, "input inputVar", "ranks.input_var == 1"),
        ({}, {"training_mode": 1}, "attribute training_mode", "not supported"),
        ({}, {"momentum": float("nan")}, "attribute momentum", "finite"),
        ({}, {"alpha": 1.0}, "attribute alpha", "unknown attribute"),
        ({}, {"epsilon": float("nan")}, "attribute epsilon", "finite"),
        ({}, {"epsilon": float("inf")}, "attribute epsilon", "finite"),
        ({}, {"epsilon": "small"}, "attribute epsilon", "expected a number"),
    ],
)
def test_contract_errors_name_op_subject_and_rule(change, attrs, subject, words):
    inputs = {**good(), **change}
    with pytest.raises(ContractError) as caught:
        bn.kernel(inputs, attrs=attrs)
    text = str(caught.value)
    assert text.startswith("ai.onnx BatchNormalization-15: ") and subject in text and words in text, text
    assert isinstance(caught.value, ValueError)


def test_missing_input_is_refused():
    inputs = good()
    del inputs["inputVar"]
    with pytest.raises(
        ContractError, match=r"input inputVar: required input inputVar is missing \(ONNX name input_var\)"
    ):
        bn.kernel(inputs)


def test_momentum_is_ignored_in_inference_mode():
    """momentum only drives the training update (an audit found 0.99, which exporters write with
    training_mode 0 and ONNX Runtime runs, refused): every finite value gives the same output."""
    inputs = {**good(), "x": np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)}
    expected = bn.kernel(inputs)["y"]
    for momentum in (0.9, 0.99, 0.0, 1.0, -2.5, float(np.float32(0.9))):
        np.testing.assert_array_equal(bn.kernel(inputs, attrs={"momentum": momentum})["y"], expected)


def test_device_limits_are_checked_before_gpu_work():
    shapes = {k: v.shape for k, v in good().items()}
    with pytest.raises(ContractError, match="maxComputeInvocationsPerWorkgroup"):
        bn.plan(shapes, {"T": "float32"}, tunables={"WORKGROUP_SIZE": 512})
    big = {**shapes, "x": (64, 3, 1024, 1024)}
    with pytest.raises(ContractError, match=r"input x: .* over the device's maxBufferSize = 268435456"):
        bn.plan(big, {"T": "float32"})


def test_f16_needs_the_device_feature():
    shapes = {k: v.shape for k, v in good().items()}
    with pytest.raises(ContractError, match=r"f16Ok\(dtypes.T\)") as caught:
        bn.plan(shapes, {"T": "float16"}, caps={"features": []})
    assert (
        "float16 needs the device feature shader-f16, which this device does not have (features: none)"
        in str(caught.value)
    )


def test_device_snapshot_uses_webgpu_feature_names():
    caps = device_caps(default_device())
    assert "subgroup" not in caps.features
    assert {"shader-f16", "subgroups"} <= caps.features
