"""Property-based tests (hypothesis) of the generated ops (issue 9).

* `test_fuzz_<op>_matches_the_reference`: valid requests (ranks 2-5, dims 1-70, at most 50,000
  elements; float32 / float16; epsilon, num_groups dividing C, stash_type, SkipGroupNorm's and
  GroupNorm's activation, layout and gamma / beta type, SkipGroupNorm's skip shapes, bias and S;
  the layer family's axis, broadcast Scale and B, T and V apart, skip forms and optional outputs;
  the default variant or a forced one that applies)
  run with NaN-poisoned outputs and match tests/oracles.py's float64 references within docs/TESTING.md's
  tolerances (stash_type=10 as tests/kernels/test_group_normalization_stash16.py judges it).
* `test_fuzz_<op>_empty`: requests with a zero dimension, any variant forced: outputs of the
  contract's (empty) shape and a plan with no passes (issue 9's rule for empty outputs).
* `test_fuzz_<op>_invalid`: requests that break one contract rule: ContractError only.

Malformed calls are fuzzed in a child process: test_fuzz_malformed.py.

Each example draws a seed for its data, so the falsifying example hypothesis prints reproduces the
failure. The example database is off (nothing is written to the tree); examples are not derandomized.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generated import ContractError, Tensor
from generated import default_device
from tests.device_helpers import poisoned_call
from tests.kernels.group_norm_support import assert_close_f16_stage, stash16_exact_statistics_ref
from tests.oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    node_reference,
    microsoft_group_norm_ref,
    skip_group_norm_ref,
)
from tests.runtime.hostile_support import MICROSOFT, OPS, check_refusal

MAX_ELEMENTS = 50_000
MAX_DIM = 70


def fuzz_settings(examples):
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=False,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


DTYPES = st.sampled_from([np.float32, np.float16])
EPSILONS = st.one_of(st.sampled_from([1e-5, 1e-3, 0.1, 1.0]), st.floats(1e-6, 1.0))
SEEDS = st.integers(0, 2**32 - 1)

# Tunables that let a forced variant apply to small data (as the op test files use them).
GN_SMALL_SPLITS = {"STATS_VALUES_PER_SPLIT": 64, "SPLIT_STATS_MIN_HIDDEN": 1}
IN_SPLIT_SMALL = {"SPLIT_STATS_MIN_SPATIAL": 1, "STATS_VALUES_PER_SPLIT": 8}
IN_BATCHED_SMALL = {"WORKGROUP_SIZE": 16, "BATCHED_MIN_PLANES_PER_WORKGROUP": 1}


def variant_tunables(op_id, variant):
    if variant is None:
        return None
    if op_id == "gn" and variant.startswith("group_splitk"):
        return GN_SMALL_SPLITS
    if op_id == "in" and variant.startswith("plane_splitk"):
        return IN_SPLIT_SMALL
    if op_id == "in" and variant == "plane_batched_vec4":
        return IN_BATCHED_SMALL
    return None


@st.composite
def dims(draw, rank, min_dim=1, fixed=None, cap=MAX_ELEMENTS):
    """`rank` dims in min_dim..70 whose product is at most `cap`; `fixed` maps an axis to its dim."""
    fixed = fixed or {}
    shape = [None] * rank
    product = max(1, math.prod(d for d in fixed.values() if d))
    order = draw(st.permutations([i for i in range(rank) if i not in fixed]))
    for i in order:
        high = max(min_dim, min(MAX_DIM, cap // product))
        shape[i] = draw(st.integers(min_dim, high))
        product *= max(1, shape[i])
    for i, d in fixed.items():
        shape[i] = d
    return tuple(shape)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def random_x(rng, shape, dtype, offset):
    spread = rng.uniform(0.5, 3.0)
    return (rng.standard_normal(shape) * spread + rng.uniform(-1, 1) * offset * spread).astype(dtype)


def per_channel(rng, c, dtype, low=-2.0, high=2.0):
    return rng.uniform(low, high, c).astype(dtype)


# ---------------------------------------------------------------------------------------------------------
# Requests: (op id, inputs, attrs, outputs, reference function)


@st.composite
def bn_requests(draw, min_dim=1):
    shape = draw(dims(draw(st.integers(2, 5)), min_dim))
    dtype = draw(DTYPES)
    rng = np.random.default_rng(draw(SEEDS))
    c = shape[1]
    inputs = {
        "x": random_x(rng, shape, dtype, 3.0),
        "scale": per_channel(rng, c, dtype),
        "b": per_channel(rng, c, dtype, -1, 1),
        "inputMean": per_channel(rng, c, dtype, -1, 1),
        "inputVar": per_channel(rng, c, dtype, 0.1, 3.0),
    }
    return "bn", inputs, {"epsilon": draw(EPSILONS)}, None


@st.composite
def gn_requests(draw, min_dim=1):
    rank = draw(st.integers(3, 5))
    c = draw(st.integers(min_dim, 64))
    shape = draw(dims(rank, min_dim, fixed={1: c}))
    num_groups = draw(st.sampled_from(divisors(c) if c else [1, 2, 3]))
    dtype = draw(DTYPES)
    stash_type = draw(st.sampled_from([1, 10]))
    rng = np.random.default_rng(draw(SEEDS))
    inputs = {
        "x": random_x(rng, shape, dtype, draw(st.sampled_from([0.0, 0.1, 3.0]))),
        "scale": per_channel(rng, c, dtype),
        "bias": per_channel(rng, c, dtype, -1, 1),
    }
    return "gn", inputs, {"num_groups": num_groups, "epsilon": draw(EPSILONS), "stash_type": stash_type}, None


@st.composite
def in_requests(draw, min_dim=1):
    shape = draw(dims(draw(st.integers(3, 5)), min_dim))
    dtype = draw(DTYPES)
    rng = np.random.default_rng(draw(SEEDS))
    c = shape[1]
    inputs = {
        "input": random_x(rng, shape, dtype, 3.0),
        "scale": per_channel(rng, c, dtype),
        "b": per_channel(rng, c, dtype, -1, 1),
    }
    return "in", inputs, {"epsilon": draw(EPSILONS)}, None


@st.composite
def sgn_requests(draw, min_dim=1):
    channels_last = draw(st.sampled_from([0, 1]))
    c = draw(st.integers(min_dim, 64))
    shape = draw(dims(4, min_dim, fixed={3 if channels_last else 1: c}))
    groups = draw(st.sampled_from(divisors(c) if c else [1, 2, 3]))
    t, m = draw(DTYPES), draw(DTYPES)
    n = shape[0]
    skip_shape = draw(st.sampled_from([shape, (n, c), (n, 1, 1, c)]))
    rng = np.random.default_rng(draw(SEEDS))
    inputs = {
        "X": random_x(rng, shape, t, 2.0),
        "gamma": per_channel(rng, c, m),
        "beta": per_channel(rng, c, m, -1, 1),
        "skip": (rng.standard_normal(skip_shape) * rng.uniform(0.2, 1.5)).astype(t),
    }
    if draw(st.booleans()):
        inputs["bias"] = per_channel(rng, c, t, -1, 1)
    attrs = {
        "groups": groups,
        "activation": draw(st.sampled_from([0, 1])),
        "channels_last": channels_last,
        "epsilon": draw(EPSILONS),
    }
    outputs = draw(st.sampled_from([("Y",), ("Y", "S")]))
    return "sgn", inputs, attrs, outputs


@st.composite
def mgn_requests(draw, min_dim=1):
    channels_last = draw(st.sampled_from([0, 1]))
    c = draw(st.integers(min_dim, 64))
    shape = draw(dims(4, min_dim, fixed={3 if channels_last else 1: c}))
    t, m = draw(DTYPES), draw(DTYPES)
    rng = np.random.default_rng(draw(SEEDS))
    inputs = {
        "X": random_x(rng, shape, t, draw(st.sampled_from([0.0, 3.0]))),
        "gamma": per_channel(rng, c, m),
        "beta": per_channel(rng, c, m, -1, 1),
    }
    attrs = {
        "groups": draw(st.sampled_from(divisors(c) if c else [1, 2, 3])),
        "activation": draw(st.sampled_from([0, 1])),
        "channels_last": channels_last,
        "epsilon": draw(EPSILONS),
    }
    return "mgn", inputs, attrs, None


@st.composite
def broadcast_shape(draw, normalized):
    """A shape that broadcasts to `normalized` along one run of its axes: the whole shape, a suffix of
    it, or one of those with some of its leading axes 1 (a suffix's leading 1s: (1, D) for (S, D))."""
    start = draw(st.integers(0, max(0, len(normalized) - 1)))
    suffix = list(normalized[start:])
    ones = draw(st.integers(0, len(suffix)))
    return tuple([1] * ones + suffix[ones:]) if draw(st.booleans()) else tuple(suffix)


@st.composite
def layer_requests(draw, op_id, min_dim=1):
    """LayerNormalization / RMSNormalization / SimplifiedLayerNormalization: rank 1-4, any axis, a
    broadcast Scale (and B); min_dim=0 (empty and invalid requests): axis -1, one type, 1-D parameters."""
    rank = draw(st.integers(1, 4))
    shape = draw(dims(rank, min_dim, cap=20_000))
    axis = draw(st.integers(-rank, rank - 1)) if min_dim else -1
    normalized = shape[axis % rank :]
    t = draw(DTYPES)
    v = draw(DTYPES) if op_id in ("rms", "sln") and min_dim else t
    rng = np.random.default_rng(draw(SEEDS))
    scale_shape = draw(broadcast_shape(normalized)) if min_dim else normalized[-1:]
    inputs = {"x": random_x(rng, shape, t, draw(st.sampled_from([0.0, 0.1, 3.0]))), "scale": None}
    inputs["scale"] = rng.uniform(-2, 2, scale_shape).astype(v)
    if op_id == "ln" and draw(st.booleans()):
        inputs["b"] = rng.uniform(-1, 1, draw(broadcast_shape(normalized)) if min_dim else normalized[-1:])
        inputs["b"] = inputs["b"].astype(t)
    attrs = {"axis": axis, "epsilon": draw(EPSILONS)}
    optional = {"ln": ("mean", "invStdDev"), "sln": ("inv_std_var",), "rms": ()}[op_id]
    chosen = draw(st.lists(st.sampled_from(optional), unique=True)) if optional and min_dim else []
    return op_id, inputs, attrs, (("y",) + tuple(chosen)) if chosen else None


@st.composite
def skip_layer_requests(draw, op_id, min_dim=1):
    """SkipLayerNormalization / SkipSimplifiedLayerNormalization: (tokens, hidden) or (batch,
    sequence, hidden), skip full or repeated over the batch, optional beta and bias and outputs."""
    rank = draw(st.integers(2, 3))
    shape = draw(dims(rank, min_dim, cap=20_000))
    hidden = shape[-1]
    t = draw(DTYPES)
    rng = np.random.default_rng(draw(SEEDS))
    skip_shape = draw(st.sampled_from([shape, shape[1:], (1,) + shape[1:]] if rank == 3 else [shape]))
    inputs = {
        "input": random_x(rng, shape, t, 2.0),
        "skip": (rng.standard_normal(skip_shape) * rng.uniform(0.2, 1.5)).astype(t),
        "gamma": per_channel(rng, hidden, t),
    }
    optional = ("beta", "bias") if op_id == "skln" else ("bias",)
    for key in optional:
        if draw(st.booleans()):
            inputs[key] = per_channel(rng, hidden, t, -1, 1)
    outputs = (
        ("mean", "inv_std_var", "input_skip_bias_sum")
        if op_id == "skln"
        else ("inv_std_var", "input_skip_bias_sum")
    )
    chosen = draw(st.lists(st.sampled_from(outputs), unique=True)) if min_dim else []
    return op_id, inputs, {"epsilon": draw(EPSILONS)}, (("output",) + tuple(chosen)) if chosen else None


REQUESTS = {
    "bn": bn_requests,
    "gn": gn_requests,
    "in": in_requests,
    "sgn": sgn_requests,
    "mgn": mgn_requests,
    **{op_id: functools.partial(layer_requests, op_id) for op_id in ("ln", "rms", "sln")},
    **{op_id: functools.partial(skip_layer_requests, op_id) for op_id in ("skln", "sksln")},
}
LAYER_FAMILY = ("ln", "rms", "sln", "skln", "sksln")


def channels(op_id, shape, attrs):
    """C of an X of `shape`: its axis 1, or for the com.microsoft ops the axis `channels_last` says."""
    if op_id in MICROSOFT:
        return shape[3 if attrs["channels_last"] else 1]
    return OPS[op_id].channels(shape)


def references(op_id, inputs, attrs):
    """{output key: float64 reference}."""
    if op_id in LAYER_FAMILY:
        return node_reference(OPS[op_id].module, inputs, attrs)
    if op_id == "bn":
        return {
            "y": batch_normalization_ref(
                inputs["x"],
                inputs["scale"],
                inputs["b"],
                inputs["inputMean"],
                inputs["inputVar"],
                attrs["epsilon"],
            )
        }
    if op_id == "gn":
        return {"y": group_normalization_ref(inputs["x"], inputs["scale"], inputs["bias"], **attrs)}
    if op_id == "in":
        return {
            "output": instance_normalization_ref(
                inputs["input"], inputs["scale"], inputs["b"], attrs["epsilon"]
            )
        }
    if op_id == "mgn":
        return {
            "Y": microsoft_group_norm_ref(
                inputs["X"],
                inputs["gamma"],
                inputs["beta"],
                attrs["groups"],
                attrs["epsilon"],
                attrs["activation"],
                attrs["channels_last"],
            )
        }
    y, s = skip_group_norm_ref(
        inputs["X"],
        inputs["gamma"],
        inputs["beta"],
        inputs["skip"],
        inputs.get("bias"),
        attrs["groups"],
        attrs["epsilon"],
        attrs["activation"],
        attrs["channels_last"],
        inputs["X"].dtype,
    )
    return {"Y": y, "S": s}


def body_statistics_trustworthy(x, num_groups):
    """Where tests/kernels/test_group_normalization_stash16.py trusts the ONNX body's own f16
    statistics: every row's mean within a tenth of its spread of zero, at most 4096 values a row."""
    rows = x.astype(np.float64).reshape(x.shape[0], num_groups, -1)
    return rows.shape[2] <= 4096 and bool(np.all(np.abs(rows.mean(axis=2)) <= 0.1 * rows.std(axis=2)))


def check_stash16(actual, inputs, attrs, dtype, context):
    """stash_type=10 against the exact-statistics body everywhere, and against tests/oracles.py's
    literal body where its f16 statistics are trustworthy."""
    x, scale, bias = inputs["x"], inputs["scale"], inputs["bias"]
    ref, normalized, mean_ulp = stash16_exact_statistics_ref(
        x, scale, bias, attrs["num_groups"], attrs["epsilon"]
    )
    assert_close_f16_stage(
        actual, ref, normalized, scale, dtype, context + " (exact statistics)", extra=mean_ulp
    )
    if body_statistics_trustworthy(x, attrs["num_groups"]):
        literal = group_normalization_ref(x, scale, bias, **attrs)
        ones, zeros = np.ones(x.shape[1], x.dtype), np.zeros(x.shape[1], x.dtype)
        literal_normalized = group_normalization_ref(x, ones, zeros, **attrs)
        assert_close_f16_stage(actual, literal, literal_normalized, scale, dtype, context + " (ONNX body)")


def request_dtypes(op_id, inputs):
    """{type variable: dtype name} of the inputs (T, SkipGroupNorm's M, RMS's V)."""
    return {
        spec.type_var: inputs[spec.key].dtype.name for spec in OPS[op_id].module.INPUTS if spec.key in inputs
    }


def applicable_variants(op_id, inputs, attrs, outputs):
    """The variants plan() accepts for this (valid) request on the test device, each with its tunables."""
    module = OPS[op_id].module
    shapes = {k: v.shape for k, v in inputs.items()}
    dtypes = request_dtypes(op_id, inputs)
    found = []
    for variant in OPS[op_id].variants:
        try:
            module.plan(
                shapes,
                dtypes,
                attrs,
                variant=variant,
                tunables=variant_tunables(op_id, variant),
                device=default_device(),
                outputs=outputs,
            )
        except ContractError as error:
            if not str(error.subject).startswith("variant"):
                raise AssertionError(
                    f"a valid request refused for a reason other than the variant: {error}"
                ) from error
            continue
        found.append(variant)
    return found


def check_valid(op_id, inputs, attrs, outputs, variant):
    module = OPS[op_id].module
    tunables = variant_tunables(op_id, variant)
    context = f"{op_id} {({k: (v.shape, v.dtype.name) for k, v in inputs.items()})} attrs={attrs} outputs={outputs} variant={variant} tunables={tunables}"
    result = poisoned_call(module, inputs, outputs=outputs, attrs=attrs, variant=variant, tunables=tunables)
    stash16 = op_id == "gn" and attrs.get("stash_type") == 10
    expected = None if stash16 else references(op_id, inputs, attrs)
    dtype = inputs[OPS[op_id].keys[0]].dtype
    for key, value in result.items():
        actual = value.numpy() if isinstance(value, Tensor) else value
        if stash16:
            check_stash16(actual, inputs, attrs, dtype, f"{context} {key}")
        else:  # each output at the tolerance of its own type (RMS's Y is V, Mean float32)
            assert_close(actual, expected[key], actual.dtype, f"{context} {key}")


def _valid_fuzz(op_id, examples):
    @fuzz_settings(examples)
    @given(data=st.data())
    def run(data):
        _, inputs, attrs, outputs = data.draw(REQUESTS[op_id](), label="request")
        variant = data.draw(
            st.sampled_from([None] + applicable_variants(op_id, inputs, attrs, outputs)), label="variant"
        )
        check_valid(op_id, inputs, attrs, outputs, variant)

    run()


def test_fuzz_batch_normalization_matches_the_reference():
    _valid_fuzz("bn", 40)


def test_fuzz_group_normalization_matches_the_reference():
    _valid_fuzz("gn", 50)


def test_fuzz_instance_normalization_matches_the_reference():
    _valid_fuzz("in", 40)


def test_fuzz_skip_group_norm_matches_the_reference():
    _valid_fuzz("sgn", 50)


@pytest.mark.parametrize("op_id", LAYER_FAMILY)
def test_fuzz_layer_family_matches_the_reference(op_id):
    _valid_fuzz(op_id, 25)


def test_fuzz_microsoft_group_norm_matches_the_reference():
    _valid_fuzz("mgn", 40)


# ---------------------------------------------------------------------------------------------------------
# Empty requests: any variant forced, empty outputs, no passes


@st.composite
def empty_requests(draw, op_id):
    """A valid request with one dimension (of X, possibly C) zero."""
    op, inputs, attrs, outputs = draw(REQUESTS[op_id](min_dim=0))
    key = OPS[op_id].keys[0]
    if inputs[key].size:
        axis = draw(st.integers(0, inputs[key].ndim - 1))
        shape = list(inputs[key].shape)
        shape[axis] = 0
        x = np.empty(shape, inputs[key].dtype)
        c = channels(op_id, shape, attrs)
        fixed = {}
        for k, v in inputs.items():
            if k == key:
                fixed[k] = x
            elif v.ndim == 1:
                fixed[k] = v[:c] if len(v) >= c else v
            elif k == "skip" and op_id in LAYER_FAMILY:  # full, or X's last two axes repeated
                fixed[k] = np.empty(
                    shape if v.shape == inputs[key].shape else v.shape[:-2] + tuple(shape[-2:]), v.dtype
                )
            elif k == "skip":
                n = shape[0]
                fixed[k] = np.empty(
                    shape if v.shape == inputs[key].shape else ((n, c) if v.ndim == 2 else (n, 1, 1, c)),
                    v.dtype,
                )
        inputs = fixed
    return op, inputs, attrs, outputs


def _empty_fuzz(op_id, examples):
    module = OPS[op_id].module
    caps = {"features": ["shader-f16", "subgroups"]}

    @fuzz_settings(examples)
    @given(data=st.data())
    def run(data):
        _, inputs, attrs, outputs = data.draw(empty_requests(op_id), label="request")
        variant = data.draw(st.sampled_from((None,) + OPS[op_id].variants), label="variant")
        if variant == "group_stash_f16_serial":
            attrs = {**attrs, "stash_type": 10}
        shape = inputs[OPS[op_id].keys[0]].shape
        result = module.kernel(inputs, attrs=attrs, outputs=outputs, variant=variant)
        for key, value in result.items():
            assert value.shape == shape and value.dtype == inputs[OPS[op_id].keys[0]].dtype, (
                key,
                value.shape,
            )
        shapes = {k: v.shape for k, v in inputs.items()}
        dtypes = request_dtypes(op_id, inputs)
        p = module.plan(shapes, dtypes, attrs, variant=variant, outputs=outputs, caps=caps)
        assert p.passes == (), f"plan {p.variant} for empty {shape} has {len(p.passes)} passes"

    run()


@pytest.mark.parametrize("op_id", list(OPS))
def test_fuzz_empty(op_id):
    _empty_fuzz(op_id, 25)


# ---------------------------------------------------------------------------------------------------------
# Invalid requests (one contract rule broken): ContractError only


@st.composite
def invalid_requests(draw, op_id):
    """(inputs, attrs, outputs, what was broken) from a valid request with one rule broken."""
    _, inputs, attrs, outputs = draw(REQUESTS[op_id](min_dim=0))
    inputs, attrs = dict(inputs), dict(attrs)
    info = OPS[op_id]
    first = info.keys[0]
    x = inputs[first]
    other = np.float16 if x.dtype == np.float32 else np.float32
    params = [k for k in info.keys[1:] if k in inputs and inputs[k].ndim == 1]
    choices = ["param_length", "param_rank", "float64", "rank_low"]
    if any(_type_var(info, k) == "T" for k in info.keys[1:] if k in inputs):  # RMS's scale is V: any type
        choices.append("mixed_dtype")
    if op_id == "gn":
        choices += ["groups_do_not_divide", "groups_not_positive", "stash_type"]
    if op_id in MICROSOFT:
        choices += ["groups_do_not_divide", "groups_not_positive", "activation", "rank_high"]
    if op_id == "sgn":
        choices += ["skip_shape"]
    if op_id == "mgn":
        choices += ["channels_last"]
    if op_id == "bn":
        choices += ["training_mode", "momentum"]  # momentum: not a finite number (any finite one is accepted)
    kind = draw(st.sampled_from(choices))
    if kind == "param_length":
        key = draw(st.sampled_from(params))
        inputs[key] = np.ones(len(inputs[key]) + draw(st.sampled_from([1, 2, 5])), inputs[key].dtype)
    elif kind == "param_rank":
        key = draw(st.sampled_from(params))
        inputs[key] = inputs[key].reshape(1, -1)
    elif kind == "mixed_dtype":  # a parameter of X's own type variable in the other type
        key = draw(st.sampled_from([k for k in info.keys[1:] if k in inputs and _type_var(info, k) == "T"]))
        inputs[key] = inputs[key].astype(other)
    elif kind == "float64":
        inputs[first] = x.astype(np.float64)
    elif kind == "rank_low":
        low = {
            "bn": 1,
            "gn": 2,
            "in": 2,
            "sgn": 3,
            "ln": 0,
            "rms": 0,
            "sln": 0,
            "skln": 1,
            "sksln": 1,
            "mgn": 3,
        }[op_id]
        inputs[first] = np.ones(x.shape[:low], x.dtype)
    elif kind == "rank_high":
        inputs[first] = x.reshape(x.shape + (1,))
    elif kind == "groups_do_not_divide":
        name = "num_groups" if op_id == "gn" else "groups"
        c = channels(op_id, x.shape, attrs)
        bad = [g for g in range(2, c + 4) if c % g]
        if not bad:
            bad = [c + 1] if c else [3]  # C = 0 and C = 1 have no non-divisor below c + 4 but c + 1
            bad = [g for g in bad if c % g]
        attrs[name] = draw(st.sampled_from(bad)) if bad else 0
    elif kind == "groups_not_positive":
        attrs["num_groups" if op_id == "gn" else "groups"] = draw(st.sampled_from([0, -1, -64]))
    elif kind == "stash_type":
        attrs["stash_type"] = draw(st.sampled_from([0, 2, 11, 16]))
    elif kind == "skip_shape":
        n = x.shape[0]
        c = x.shape[3 if attrs["channels_last"] else 1]
        inputs["skip"] = np.ones(
            draw(st.sampled_from([(n, c + 1), (n, 1, c), (n + 1, c), (n, 1, 1, 1, c), (n, c, 1, 2)])), x.dtype
        )
    elif kind == "activation":
        attrs["activation"] = draw(st.sampled_from([2, -1]))
    elif kind == "channels_last":  # GroupNorm's schema: 1 or 0
        attrs["channels_last"] = draw(st.sampled_from([2, -1, 255]))
    elif kind == "training_mode":
        attrs["training_mode"] = 1
    elif kind == "momentum":
        attrs["momentum"] = draw(st.sampled_from([float("nan"), float("inf"), "0.9"]))
    return inputs, attrs, outputs, kind


def _type_var(info, key):
    return next(spec.type_var for spec in info.module.INPUTS if spec.key == key)


def _is_really_invalid(op_id, inputs, attrs, kind):
    """A few breakages make a valid request on some draws (a skip shape that happens to match, a
    layer norm parameter grown to one value: (1,) broadcasts to any last axis, 0 included)."""
    if kind == "param_length" and op_id in ("ln", "rms", "sln"):
        hidden = inputs["x"].shape[-1]
        return any(len(inputs[k]) not in (1, hidden) for k in ("scale", "b") if k in inputs)
    if kind == "skip_shape":
        x = inputs["X"]
        n, c = x.shape[0], x.shape[3 if attrs["channels_last"] else 1]
        return inputs["skip"].shape not in (x.shape, (n, c), (n, 1, 1, c))
    if kind == "groups_do_not_divide":
        name = "num_groups" if op_id == "gn" else "groups"
        c = channels(op_id, inputs[OPS[op_id].keys[0]].shape, attrs)
        return attrs[name] < 1 or c % attrs[name] != 0
    return True


@pytest.mark.parametrize("op_id", list(OPS))
def test_fuzz_invalid(op_id):
    info = OPS[op_id]

    @fuzz_settings(80)
    @given(data=st.data())
    def run(data):
        inputs, attrs, outputs, kind = data.draw(invalid_requests(op_id), label="request")
        if not _is_really_invalid(op_id, inputs, attrs, kind):
            return
        what = f"{kind}: {({k: (v.shape, v.dtype.name) for k, v in inputs.items()})} attrs={attrs}"
        try:
            result = info.module.kernel(inputs, attrs=attrs, outputs=outputs)
        except ContractError as error:
            check_refusal(error, info.op, what=what)
            return
        except Exception as error:
            raise AssertionError(f"{what}: {type(error).__name__}: {str(error)[:400]}") from error
        raise AssertionError(f"{what}: accepted, returned {({k: v.shape for k, v in result.items()})}")

    run()
