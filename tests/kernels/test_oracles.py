"""The test oracles checked against onnx's ReferenceEvaluator, onnxruntime and the ONNX test data."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from tests.oracles import (
    assert_close,
    backend_node_cases,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    onnxruntime_run,
    pytorch_converted_cases,
    rng_for,
    run_seed,
    seed_note,
    single_node_model,
    skip_group_norm_ref,
    tolerance_ok,
)

DTYPES = [np.float32, np.float16]


@pytest.fixture
def rng_seed(request):
    return rng_for(request.node.name)


def normal(rng, shape, dtype, loc=0.0, scale=1.0):
    return (loc + scale * rng.standard_normal(shape)).astype(dtype)


def batch_norm_inputs(rng, shape, dtype):
    channels = shape[1]
    return {
        "X": normal(rng, shape, dtype, loc=0.5, scale=2.0),
        "scale": normal(rng, channels, dtype),
        "B": normal(rng, channels, dtype),
        "input_mean": normal(rng, channels, dtype),
        "input_var": rng.uniform(0.2, 2.0, channels).astype(dtype),
    }


def norm_inputs(rng, shape, dtype, bias_name):
    channels = shape[1]
    return {
        "X": normal(rng, shape, dtype, loc=0.5, scale=2.0),
        "scale": normal(rng, channels, dtype),
        bias_name: normal(rng, channels, dtype),
    }


def reference_evaluator(op_type, inputs, attrs, opset):
    model = single_node_model(op_type, inputs, attrs, opset)
    return ReferenceEvaluator(model).run(None, inputs)[0]


# ---------------------------------------------------------------------------
# Against onnx's ReferenceEvaluator (which computes in the tensors' own type)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 7), (2, 4, 3, 5), (1, 3, 2, 2, 3)])
def test_batch_normalization_matches_reference_evaluator(rng_seed, dtype, shape):
    rng, seed = rng_seed
    inputs = batch_norm_inputs(rng, shape, dtype)
    for epsilon in (1e-5, 0.1):
        expected = reference_evaluator("BatchNormalization", inputs, {"epsilon": epsilon}, 15)
        actual = batch_normalization_ref(*inputs.values(), epsilon)
        assert_close(expected, actual, dtype, f"BatchNormalization {shape} eps={epsilon}, {seed_note(seed)}")


@pytest.mark.parametrize("stash_type", [1, 10])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "groups"), [((2, 4, 3, 3), 2), ((3, 6, 5), 3), ((1, 8, 2, 3, 2), 8), ((2, 3), 1)]
)
def test_group_normalization_matches_reference_evaluator(rng_seed, dtype, stash_type, shape, groups):
    rng, seed = rng_seed
    inputs = norm_inputs(rng, shape, dtype, "bias")
    attrs = {"num_groups": groups, "stash_type": stash_type, "epsilon": 1e-3}
    expected = reference_evaluator("GroupNormalization", inputs, attrs, 21)
    actual = group_normalization_ref(*inputs.values(), groups, 1e-3, stash_type)
    assert_close(expected, actual, dtype, f"GroupNormalization {shape} {attrs}, {seed_note(seed)}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_normalization_stash_f16_is_the_function_body_bit_for_bit(rng_seed, dtype):
    # With unit scale and zero bias Y is the normalized stage itself, whose
    # float16 rounding the reference claims to reproduce exactly.
    rng, seed = rng_seed
    shape, groups = (2, 6, 4, 5), 3
    inputs = {
        "X": normal(rng, shape, dtype, loc=0.5, scale=2.0),
        "scale": np.ones(6, dtype),
        "bias": np.zeros(6, dtype),
    }
    expected = reference_evaluator("GroupNormalization", inputs, {"num_groups": groups, "stash_type": 10}, 21)
    actual = group_normalization_ref(*inputs.values(), groups, 1e-5, stash_type=10)
    np.testing.assert_array_equal(actual, expected.astype(np.float64), err_msg=seed_note(seed))


def test_group_normalization_stash_f16_is_not_the_exact_result(rng_seed):
    # A large mean makes E[x^2] - E[x]^2 in float16 visibly inexact: proof that
    # stash_type=10 really changes the computation.
    rng, seed = rng_seed
    x = normal(rng, (1, 4, 8, 8), np.float32, loc=20.0)
    scale, bias = np.ones(4, np.float32), np.zeros(4, np.float32)
    exact = group_normalization_ref(x, scale, bias, 2, stash_type=1)
    stashed = group_normalization_ref(x, scale, bias, 2, stash_type=10)
    assert not tolerance_ok(stashed, exact, np.float32).all(), seed_note(seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 3, 5), (1, 2, 2, 3, 4)])
def test_instance_normalization_matches_reference_evaluator(rng_seed, dtype, shape):
    rng, seed = rng_seed
    inputs = norm_inputs(rng, shape, dtype, "B")
    for epsilon in (1e-5, 0.1):
        expected = reference_evaluator("InstanceNormalization", inputs, {"epsilon": epsilon}, 6)
        actual = instance_normalization_ref(*inputs.values(), epsilon)
        assert_close(
            expected, actual, dtype, f"InstanceNormalization {shape} eps={epsilon}, {seed_note(seed)}"
        )


# ---------------------------------------------------------------------------
# Against onnxruntime's CPU provider


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_normalization_matches_onnxruntime(rng_seed, dtype):
    rng, seed = rng_seed
    inputs = batch_norm_inputs(rng, (2, 5, 3, 4), dtype)
    (expected,) = onnxruntime_run("BatchNormalization", inputs, {"epsilon": 1e-3}, 15)
    assert expected.dtype == dtype
    assert_close(expected, batch_normalization_ref(*inputs.values(), 1e-3), dtype, seed_note(seed))


@pytest.mark.parametrize("stash_type", [1, 10])
@pytest.mark.parametrize("dtype", DTYPES)
def test_group_normalization_matches_onnxruntime(rng_seed, dtype, stash_type):
    # onnxruntime's stash_type=10 rounds to float16 too, but its reductions are
    # more accurate than the ONNX function body's (up to 2x our float16
    # tolerance away from it on this data), so it is held to the exact result.
    rng, seed = rng_seed
    inputs = norm_inputs(rng, (2, 6, 3, 4), dtype, "bias")
    attrs = {"num_groups": 3, "stash_type": stash_type}
    (expected,) = onnxruntime_run("GroupNormalization", inputs, attrs, 21)
    assert expected.dtype == dtype
    tolerance_dtype = np.float16 if stash_type == 10 else dtype
    actual = group_normalization_ref(*inputs.values(), 3, stash_type=1)
    assert_close(expected, actual, tolerance_dtype, f"{attrs}, {seed_note(seed)}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_instance_normalization_matches_onnxruntime(rng_seed, dtype):
    rng, seed = rng_seed
    inputs = norm_inputs(rng, (2, 3, 4, 5), dtype, "B")
    (expected,) = onnxruntime_run("InstanceNormalization", inputs, {"epsilon": 1e-3}, 6)
    assert expected.dtype == dtype
    assert_close(expected, instance_normalization_ref(*inputs.values(), 1e-3), dtype, seed_note(seed))


def test_skip_group_norm_matches_onnxruntime(rng_seed):
    rng, seed = rng_seed
    x = normal(rng, (2, 3, 3, 8), np.float16)
    inputs = {
        "X": x,
        "gamma": normal(rng, 8, np.float16),
        "beta": normal(rng, 8, np.float16),
        "skip": normal(rng, x.shape, np.float16),
    }
    attrs = {"groups": 4, "activation": 1, "channels_last": 1, "epsilon": 1e-5}
    try:
        y, s = onnxruntime_run("SkipGroupNorm", inputs, attrs, 1, outputs=("Y", "S"), domain="com.microsoft")
    except onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented as error:
        pytest.skip(f"onnxruntime has no CPU SkipGroupNorm: {error}")
    y_ref, s_ref = skip_group_norm_ref(*inputs.values(), None, 4, 1e-5, 1, 1, np.float16)
    assert_close(s, s_ref, np.float16, f"S, {seed_note(seed)}")
    assert_close(y, y_ref, np.float16, f"Y, {seed_note(seed)}")


# ---------------------------------------------------------------------------
# SkipGroupNorm, against GroupNormalization on an explicitly built sum


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("skip_kind", ["full", "nc", "n11c"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("activation", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_skip_group_norm_ref(rng_seed, channels_last, skip_kind, with_bias, activation, dtype):
    rng, seed = rng_seed
    n, c, h, w, groups = 2, 6, 3, 5, 3
    x_nchw = normal(rng, (n, c, h, w), dtype)
    skip_nc = normal(rng, (n, c), dtype)
    if skip_kind == "full":
        skip_nchw = normal(rng, (n, c, h, w), dtype)
    else:
        skip_nchw = np.broadcast_to(skip_nc[:, :, None, None], (n, c, h, w))
    bias = normal(rng, c, dtype) if with_bias else None
    gamma, beta = normal(rng, c, np.float32), normal(rng, c, np.float32)

    def layout(t):
        return np.ascontiguousarray(t.transpose(0, 2, 3, 1) if channels_last else t)

    skip = {"full": layout(skip_nchw), "nc": skip_nc, "n11c": skip_nc.reshape(n, 1, 1, c)}[skip_kind]
    y, s = skip_group_norm_ref(
        layout(x_nchw), gamma, beta, skip, bias, groups, 1e-5, activation, channels_last, dtype
    )

    s_nchw = x_nchw.astype(np.float64) + skip_nchw
    if with_bias:
        s_nchw += bias.astype(np.float64)[:, None, None]
    s_nchw = s_nchw.astype(dtype)
    y_nchw = group_normalization_ref(s_nchw, gamma, beta, groups, 1e-5)
    if activation:
        y_nchw = y_nchw / (1 + np.exp(-y_nchw))
    context = (
        f"{skip_kind} bias={with_bias} act={activation} channels_last={channels_last}, {seed_note(seed)}"
    )
    np.testing.assert_array_equal(s, layout(s_nchw).astype(np.float64), err_msg=context)
    np.testing.assert_allclose(y, layout(y_nchw), rtol=1e-12, atol=1e-12, err_msg=context)


# ---------------------------------------------------------------------------
# The ONNX test data


def test_backend_node_case_names():
    names = {
        prefix: [name for name, _, _ in backend_node_cases(prefix)]
        for prefix in ("test_batchnorm", "test_group_normalization", "test_instancenorm")
    }
    assert names == {
        "test_batchnorm": [
            "test_batchnorm_example",
            "test_batchnorm_epsilon",
            "test_batchnorm_example_training_mode",
            "test_batchnorm_epsilon_training_mode",
        ],
        "test_group_normalization": ["test_group_normalization_example", "test_group_normalization_epsilon"],
        "test_instancenorm": ["test_instancenorm_example", "test_instancenorm_epsilon"],
    }


def _attributes(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("prefix", ["test_batchnorm", "test_group_normalization", "test_instancenorm"])
def test_backend_node_cases_agree_with_references(prefix):
    references = {
        "BatchNormalization": lambda ins, a: batch_normalization_ref(*ins, a.get("epsilon", 1e-5)),
        "GroupNormalization": lambda ins, a: group_normalization_ref(
            *ins, a["num_groups"], a.get("epsilon", 1e-5), a.get("stash_type", 1)
        ),
        "InstanceNormalization": lambda ins, a: instance_normalization_ref(*ins, a.get("epsilon", 1e-5)),
    }
    checked = 0
    for name, model, data_sets in backend_node_cases(prefix):
        (node,) = model.graph.node
        attrs = _attributes(node)
        if attrs.get("training_mode", 0):
            continue
        for inputs, outputs in data_sets:
            assert_close(outputs[0], references[node.op_type](inputs, attrs), outputs[0].dtype, name)
            checked += 1
    assert checked == 2


def test_pytorch_converted_batch_norm_cases_agree_with_reference():
    cases = pytorch_converted_cases("test_BatchNorm")
    assert [name for name, _, _ in cases] == [
        "test_BatchNorm1d_3d_input_eval",
        "test_BatchNorm2d_eval",
        "test_BatchNorm2d_momentum_eval",
        "test_BatchNorm3d_eval",
        "test_BatchNorm3d_momentum_eval",
    ]
    for name, model, data_sets in cases:
        (node,) = model.graph.node
        initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        epsilon = _attributes(node)["epsilon"]
        assert data_sets, name
        for inputs, (expected,) in data_sets:
            feeds = dict(zip([i.name for i in model.graph.input if i.name not in initializers], inputs))
            args = [feeds[i] if i in feeds else initializers[i] for i in node.input]
            assert_close(expected, batch_normalization_ref(*args, epsilon), np.float32, name)


# ---------------------------------------------------------------------------
# The comparison and seeding helpers themselves


def test_tolerances():
    ref = np.array([0.0, 1.0, -100.0])
    assert tolerance_ok(ref + [9e-6, 1e-4, -1e-2], ref, np.float32).all()
    assert list(tolerance_ok(ref + [2e-5, 2e-4, 0], ref, np.float32)) == [False, False, True]
    assert tolerance_ok(ref + [1.9e-3, 3.9e-3, 0.2], ref, "f16").all()
    assert list(tolerance_ok(ref + [2.1e-3, 0, 0.21], ref, np.float16)) == [False, True, False]


def test_assert_close_reports_the_worst_element_and_nan():
    ref = np.zeros((2, 3))
    actual = ref.copy()
    actual[0, 1] = 1e-3
    actual[1, 2] = np.nan
    with pytest.raises(AssertionError) as failure:
        assert_close(actual, ref, np.float32, "case 7, seed 42")
    message = str(failure.value)
    assert message.startswith("case 7, seed 42: 2 of 6 elements")
    assert "worst at index (1, 2)" in message and "actual nan" in message
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.zeros(3), np.zeros((1, 3)), np.float32, "shapes")
    with pytest.raises(ValueError):
        assert_close(ref, ref, "float64", "not a tensor dtype")


def test_seeding_reproduces(monkeypatch):
    first, seed = rng_for("test_a")
    again, _ = rng_for("test_a")
    other, _ = rng_for("test_b")
    assert seed == run_seed()
    draws = first.random(4)
    assert np.array_equal(draws, again.random(4))
    assert not np.array_equal(draws, other.random(4))
    # The run's seed is cached; call the uncached function to see the variable honoured.
    monkeypatch.setenv("KERNEL_TEST_SEED", "1234")
    assert run_seed.__wrapped__() == 1234
    assert "KERNEL_TEST_SEED=1234" in seed_note(1234)
