"""The float64 references of the layer-normalization family and com.microsoft GroupNorm
(generated/reference.py) checked against other implementations: onnxruntime's CPU provider
(LayerNormalization, SimplifiedLayerNormalization, SkipLayerNormalization,
SkipSimplifiedLayerNormalization), onnx's ReferenceEvaluator (RMSNormalization-23), the ONNX backend
node tests, and GroupNormalization-21 (com.microsoft GroupNorm, which ONNX Runtime runs only on CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from generated import reference
from tests.oracles import backend_node_cases, onnxruntime_run, rng_for, seed_note, single_node_model

# float32 implementations against the float64 definition: inputs of unit scale, rows of at most
# a few thousand values, so float32 accumulation stays well inside these.
ATOL, RTOL = 2e-5, 2e-4


@pytest.fixture
def rng_seed(request):
    return rng_for(request.node.name)


def close(actual, expected, note):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape, note)
    error = np.abs(actual - expected) - (ATOL + RTOL * np.abs(expected))
    assert error.max() <= 0, f"{note}: worst excess {error.max():.3g}"


@pytest.mark.parametrize(
    "shape, axis, with_bias",
    [((2, 5, 48), -1, True), ((3, 4, 6, 8), 2, False), ((4, 40), 0, True), ((2, 3, 64), -2, True)],
)
def test_layer_normalization_matches_onnxruntime(rng_seed, shape, axis, with_bias):
    rng, seed = rng_seed
    x = (3.0 + 2.0 * rng.standard_normal(shape)).astype(np.float32)
    normalized = shape[axis % len(shape) :]
    scale = rng.standard_normal(normalized).astype(np.float32)
    inputs = {"X": x, "Scale": scale}
    if with_bias:
        inputs["B"] = rng.standard_normal(normalized).astype(np.float32)
    attrs = {"axis": axis, "epsilon": 1e-3}
    got = onnxruntime_run("LayerNormalization", inputs, attrs, 17, outputs=("Y", "Mean", "InvStdDev"))
    want = reference.node_outputs("", "LayerNormalization", list(inputs.values()), attrs)
    for name, g, w in zip(("Y", "Mean", "InvStdDev"), got, want):
        close(g, w, f"{name}, {seed_note(seed)}")


def test_simplified_layer_normalization_matches_onnxruntime(rng_seed):
    rng, seed = rng_seed
    x = (1.5 + rng.standard_normal((2, 7, 96))).astype(np.float32)
    scale = rng.standard_normal(96).astype(np.float32)
    attrs = {"axis": -1, "epsilon": 1e-6}
    got = onnxruntime_run(
        "SimplifiedLayerNormalization", {"X": x, "scale": scale}, attrs, 1, outputs=("Y", "inv_std_var")
    )
    want = reference.node_outputs("", "SimplifiedLayerNormalization", [x, scale], attrs)
    for name, g, w in zip(("Y", "inv_std_var"), got, want):
        close(g, w, f"{name}, {seed_note(seed)}")


@pytest.mark.parametrize("skip_shape", [(2, 9, 64), (9, 64), (1, 9, 64)])
@pytest.mark.parametrize("with_beta, with_bias", [(True, True), (True, False), (False, False)])
def test_skip_layer_normalization_matches_onnxruntime(rng_seed, skip_shape, with_beta, with_bias):
    rng, seed = rng_seed
    x = rng.standard_normal((2, 9, 64)).astype(np.float32)
    inputs = {"input": x, "skip": rng.standard_normal(skip_shape).astype(np.float32)}
    inputs["gamma"] = rng.standard_normal(64).astype(np.float32)
    positional = [inputs["input"], inputs["skip"], inputs["gamma"], None, None]
    if with_beta:
        inputs["beta"] = positional[3] = rng.standard_normal(64).astype(np.float32)
    if with_bias:  # only after beta: the helper names inputs by position, with no empty names
        inputs["bias"] = positional[4] = rng.standard_normal(64).astype(np.float32)
    attrs = {"epsilon": 1e-5}
    outputs = ("output", "mean", "inv_std_var", "input_skip_bias_sum")
    got = onnxruntime_run("SkipLayerNormalization", inputs, attrs, 1, outputs=outputs, domain="com.microsoft")
    want = reference.node_outputs("com.microsoft", "SkipLayerNormalization", positional, attrs)
    for name, g, w in zip(outputs, got, want):
        close(np.asarray(g).reshape(np.shape(w)), w, f"{name}, {seed_note(seed)}")


def test_skip_simplified_layer_normalization_matches_onnxruntime(rng_seed):
    rng, seed = rng_seed
    x = rng.standard_normal((3, 5, 128)).astype(np.float32)
    skip = rng.standard_normal((3, 5, 128)).astype(np.float32)
    gamma = rng.standard_normal(128).astype(np.float32)
    bias = rng.standard_normal(128).astype(np.float32)
    inputs = {"input": x, "skip": skip, "gamma": gamma, "bias": bias}
    attrs = {"epsilon": 1e-6}
    outputs = ("output", "mean", "inv_std_var", "input_skip_bias_sum")
    got = onnxruntime_run(
        "SkipSimplifiedLayerNormalization", inputs, attrs, 1, outputs=outputs, domain="com.microsoft"
    )
    want = reference.node_outputs(
        "com.microsoft", "SkipSimplifiedLayerNormalization", list(inputs.values()), attrs
    )
    assert want[1] is None  # declared, never written
    for name, g, w in zip(outputs, got, want):
        if w is not None:
            close(np.asarray(g).reshape(np.shape(w)), w, f"{name}, {seed_note(seed)}")


@pytest.mark.parametrize("shape, axis", [((2, 3, 32), -1), ((2, 3, 4, 5), 1), ((6, 10), 0)])
def test_rms_normalization_matches_the_onnx_reference_evaluator(rng_seed, shape, axis):
    rng, seed = rng_seed
    x = (2.0 + rng.standard_normal(shape)).astype(np.float32)
    scale = rng.standard_normal(shape[axis % len(shape) :]).astype(np.float32)
    attrs = {"axis": axis, "epsilon": 1e-4}
    model = single_node_model("RMSNormalization", {"X": x, "scale": scale}, attrs, 23)
    (got,) = ReferenceEvaluator(model).run(None, {"X": x, "scale": scale})
    (want,) = reference.node_outputs("", "RMSNormalization", [x, scale], attrs)
    close(got, want, seed_note(seed))


@pytest.mark.parametrize("prefix", ["test_layer_normalization", "test_rms_normalization"])
def test_backend_node_tests(prefix):
    cases = backend_node_cases(prefix)
    assert cases, f"the onnx wheel has no {prefix} node tests"
    op_type = "LayerNormalization" if "layer" in prefix else "RMSNormalization"
    for name, model, data_sets in cases:
        (node,) = model.graph.node
        attrs = {a.name: (a.i if a.type == a.INT else a.f) for a in node.attribute}
        for inputs, outputs in data_sets:
            got = reference.node_outputs("", op_type, inputs, attrs)
            for expected, actual in zip(outputs, got):
                tolerance = 2e-3 if expected.dtype == np.float16 else 1e-4
                assert np.allclose(actual, expected.astype(np.float64), rtol=tolerance, atol=tolerance), name


@pytest.mark.parametrize("channels_last", [1, 0])
@pytest.mark.parametrize("activation", [0, 1])
def test_microsoft_group_norm_is_group_normalization_in_its_layout(rng_seed, channels_last, activation):
    rng, seed = rng_seed
    nchw = (2, 12, 3, 5)
    x = (5.0 + rng.standard_normal(nchw)).astype(np.float32)
    gamma, beta = rng.standard_normal(12), rng.standard_normal(12)
    expected = reference.group_normalization(x, gamma, beta, num_groups=4, epsilon=1e-5)
    if activation:
        expected = expected / (1.0 + np.exp(-expected))
    given = x.transpose(0, 2, 3, 1) if channels_last else x
    attrs = {"groups": 4, "activation": activation, "channels_last": channels_last}
    (got,) = reference.node_outputs("com.microsoft", "GroupNorm", [given, gamma, beta], attrs)
    if channels_last:
        got = got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=seed_note(seed))
