"""Hostile calls (issue 9): every invalid request is refused with a ContractError before any GPU work.

One test (or parametrized group) per decision of issue 9, over every op (batch_normalization,
group_normalization, instance_normalization, skip_group_norm, group_norm) and both dtypes where it
applies: out=, dimensions, None for an input, one input under two names, attribute values, inputs
that are not float arrays, the caller's name in errors. Beside this file: test_hostile_buffers.py (Tensors
over buffers that may abort the process, in child processes) and test_hostile_caps_and_limits.py.
Every refusal is checked for its shape (tests/runtime/hostile_support.py's check_refusal): a ContractError
(a ValueError) whose str reads "{op}: {subject}: {message} ..." and carries the rule, naming the op
and the name the caller used for the input or attribute (a bind key like `x` / `b` or an ONNX role
like `X` / `B`), never another exception type, a wgpu error, or a process abort.

Accepted requests are checked for their results: big-endian inputs give exactly the little-endian
result, None for an optional input is the same call without it, empty inputs give empty outputs
of the contract's shape with a plan of no passes for every variant.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from generated import ContractError, Tensor
from generated import group_normalization as gn
from tests.runtime.hostile_support import (
    ALL_OPS,
    DTYPES,
    OP_IDS,
    OPS,
    assert_refused,
    kernel,
    plan,
    summary,
    word,
)


# =========================================================================================================
# out= takes Tensors only; unknown out keys


@ALL_OPS
def test_out_takes_tensors_only(op_id):
    info = OPS[op_id]
    inputs = info.inputs()
    out = {info.out_key: np.zeros_like(inputs[info.keys[0]])}
    assert_refused(
        lambda: kernel(info, inputs, out=out), info.op, (info.out_key,), what="numpy array in out="
    )


@ALL_OPS
def test_unknown_out_key(op_id):
    info = OPS[op_id]
    inputs = info.inputs()
    out = {"nope": Tensor.from_numpy(np.zeros_like(inputs[info.keys[0]]))}
    assert_refused(lambda: kernel(info, inputs, out=out), info.op, ("nope",), what="unknown out= key")


# =========================================================================================================
# plan() shapes: fractions, negative, bool and other non-integer dimensions

BAD_DIMS = {
    "fraction": 4.7,
    "negative": -1,
    "huge_negative": -(2**40),
    "true": True,
    "false": False,
    "numpy_bool": np.True_,
    "nan": math.nan,
    "inf": math.inf,
    "string": "4",
    "none": None,
    "nested_list": [4],
    "huge": 2**40,
}


def _with_bad_dim(info, target, value, by_role=False):
    shapes = info.shapes()
    info.loose_skip(shapes)  # a skip valid whatever X's free axis is, so only X's dim is wrong
    if target == "x":
        key = info.keys[0]
        axis = info.spatial_axis
    else:
        key = info.keys[1]
        axis = 0
    shape = list(shapes[key])
    shape[axis] = value
    shapes[key] = tuple(shape)
    if by_role:
        shapes[info.roles[key]] = shapes.pop(key)
        key = info.roles[key]
    return shapes, key


@ALL_OPS
@pytest.mark.parametrize("target", ["x", "param"])
@pytest.mark.parametrize("bad", list(BAD_DIMS))
def test_plan_refuses_non_integer_dims(op_id, target, bad):
    info = OPS[op_id]
    if target == "param" and bad == "fraction":
        value = info.channels(info.base_shape) + 0.7  # int() would make it match C
    else:
        value = BAD_DIMS[bad]
    shapes, key = _with_bad_dim(info, target, value)
    assert_refused(lambda: plan(info, shapes), info.op, (key,), what=f"plan() with {key} dim {value!r}")


@pytest.mark.parametrize("op_id", ["bn", "gn"])
@pytest.mark.parametrize("bad", ["fraction", "true", "negative"])
def test_plan_refuses_non_integer_dims_by_role(op_id, bad):
    info = OPS[op_id]
    shapes, key = _with_bad_dim(info, "x", BAD_DIMS[bad], by_role=True)
    assert key == "X"
    assert_refused(lambda: plan(info, shapes), info.op, ("X",), what=f"plan() with X dim {BAD_DIMS[bad]!r}")


@ALL_OPS
@pytest.mark.parametrize("bad", [True, np.True_], ids=["True", "np.True_"])
def test_bool_dim_refused_after_the_same_plan_with_1(op_id, bad):
    info = OPS[op_id]
    shapes, key = _with_bad_dim(info, "x", 1)
    plan(info, shapes)  # accepted, and cached
    shapes, key = _with_bad_dim(info, "x", bad)
    assert_refused(lambda: plan(info, shapes), info.op, (key,), what=f"plan() with {key} dim {bad!r} after 1")


# =========================================================================================================
# None for an input: required -> "required input NAME is missing"; optional -> absent


def _required(info):
    return [k for k in info.keys if k not in info.optional]


REQUIRED = [(op_id, key) for op_id in OP_IDS for key in _required(OPS[op_id])]
BY_ROLE = [(op_id, key) for op_id, key in REQUIRED if OPS[op_id].roles[key] != key]


@pytest.mark.parametrize("op_id,key", REQUIRED)
def test_none_for_a_required_input_in_kernel(op_id, key):
    info = OPS[op_id]
    inputs = {**info.inputs(), key: None}
    error = assert_refused(lambda: kernel(info, inputs), info.op, (key,), what=f"kernel() with {key}=None")
    assert f"required input {key} is missing" in str(error), str(error)


@pytest.mark.parametrize("op_id,key", BY_ROLE)
def test_none_for_a_required_input_by_role_in_kernel(op_id, key):
    info = OPS[op_id]
    role = info.roles[key]
    inputs = info.inputs()
    del inputs[key]
    inputs[role] = None
    error = assert_refused(lambda: kernel(info, inputs), info.op, (role,), what=f"kernel() with {role}=None")
    assert f"required input {role} is missing" in str(error), str(error)


@pytest.mark.parametrize("op_id,key", REQUIRED)
def test_none_for_a_required_input_of_the_plain_function(op_id, key):
    info = OPS[op_id]
    inputs = {**info.inputs(), key: None}
    error = assert_refused(
        lambda: info.plain(inputs), info.op, (key, info.roles[key]), what=f"plain function with {key}=None"
    )
    assert any(f"required input {n} is missing" in str(error) for n in (key, info.roles[key])), str(error)


@pytest.mark.parametrize("op_id,key", REQUIRED)
def test_none_for_a_required_input_in_plan(op_id, key):
    info = OPS[op_id]
    shapes = {**info.shapes(), key: None}
    error = assert_refused(lambda: plan(info, shapes), info.op, (key,), what=f"plan() with {key}=None")
    assert f"required input {key} is missing" in str(error), str(error)


@DTYPES
def test_none_for_the_optional_bias_means_absent(dtype):
    info = OPS["sgn"]
    inputs = info.inputs(dtype)
    without = kernel(info, inputs)["Y"]
    with_none = kernel(info, {**inputs, "bias": None})["Y"]
    np.testing.assert_array_equal(with_none, without)
    plain = info.plain_positional([inputs[k] for k in ("X", "gamma", "beta", "skip")] + [None])
    np.testing.assert_array_equal(plain, without)
    shapes = info.shapes()
    assert (
        plan(info, {**shapes, "bias": None}, dtype, caps={"features": ["shader-f16"]}).variant
        == plan(info, shapes, dtype, caps={"features": ["shader-f16"]}).variant
    )


# =========================================================================================================
# The same input under two names (bind key and ONNX role), even with one value

DUPLICATES = [(op_id, key) for op_id, key in BY_ROLE]


@pytest.mark.parametrize("op_id,key", DUPLICATES)
def test_same_input_under_two_names_in_kernel(op_id, key):
    info = OPS[op_id]
    inputs = info.inputs()
    inputs[info.roles[key]] = inputs[key]  # the very same array
    error = assert_refused(
        lambda: kernel(info, inputs),
        info.op,
        (key, info.roles[key]),
        what=f"kernel() with {key} and {info.roles[key]}",
    )
    assert word(key, str(error)) and word(
        info.roles[key], str(error)
    ), f"the error should name both {key} and {info.roles[key]}: {error}"


@pytest.mark.parametrize("op_id,key", DUPLICATES)
def test_same_input_under_two_names_in_plan(op_id, key):
    info = OPS[op_id]
    shapes = info.shapes()
    shapes[info.roles[key]] = shapes[key]
    error = assert_refused(
        lambda: plan(info, shapes),
        info.op,
        (key, info.roles[key]),
        what=f"plan() with {key} and {info.roles[key]}",
    )
    assert word(key, str(error)) and word(
        info.roles[key], str(error)
    ), f"the error should name both {key} and {info.roles[key]}: {error}"


# =========================================================================================================
# Attribute values that do not fit the WGSL type they reach; bools are never ints

BAD_EPSILONS = {
    "1e39": 1e39,
    "-1e39": -1e39,
    "3.5e38": 3.5e38,  # over float32's maximum, 3.4028235e38
    "np.float64(1e39)": np.float64(1e39),
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "True": True,
    "string": "1e-5",
    "None": None,
}


@ALL_OPS
@pytest.mark.parametrize("bad", list(BAD_EPSILONS))
def test_epsilon_that_is_not_a_finite_f32_is_refused_by_plan(op_id, bad):
    info = OPS[op_id]
    value = BAD_EPSILONS[bad]
    assert_refused(
        lambda: plan(info, info.shapes(), attrs={"epsilon": value}),
        info.op,
        ("epsilon",),
        what=f"plan() epsilon={value!r}",
    )


@ALL_OPS
@pytest.mark.parametrize("bad", ["1e39", "-1e39", "3.5e38", "nan", "inf"])
def test_epsilon_that_is_not_a_finite_f32_is_refused_by_kernel(op_id, bad):
    info = OPS[op_id]
    value = BAD_EPSILONS[bad]
    inputs = info.inputs()
    assert_refused(
        lambda: kernel(info, inputs, attrs={"epsilon": value}),
        info.op,
        ("epsilon",),
        what=f"kernel() epsilon={value!r}",
    )


GROUP_ATTRS = {"gn": "num_groups", "sgn": "groups", "mgn": "groups"}
HUGE_INTS = {
    "2**32": 2**32,
    "2**40": 2**40,
    "2**64": 2**64,
    "-2**63": -(2**63),
    "1.5": 1.5,
    "string": "2",
    "None": None,
}


@pytest.mark.parametrize("op_id", list(GROUP_ATTRS))
@pytest.mark.parametrize("bad", list(HUGE_INTS))
def test_group_count_that_does_not_fit_is_refused(op_id, bad):
    info = OPS[op_id]
    name = GROUP_ATTRS[op_id]
    value = HUGE_INTS[bad]
    assert_refused(
        lambda: plan(info, info.shapes(), attrs={name: value}),
        info.op,
        (name,),
        what=f"plan() {name}={value!r}",
    )
    inputs = info.inputs()
    assert_refused(
        lambda: kernel(info, inputs, attrs={name: value}), info.op, (name,), what=f"kernel() {name}={value!r}"
    )


def test_num_groups_equal_to_a_huge_channel_count_is_refused_by_name():
    """num_groups = C = 2**33 divides C, but reaches u32 uniforms (and a dispatch) that cannot hold it:
    refused naming the attribute or the input, not only an internal uniform."""
    c = 2**33
    caps = {
        "features": ["shader-f16"],
        "limits": {"maxStorageBufferBindingSize": 2**40, "maxBufferSize": 2**40},
    }
    shapes = {"x": (1, c, 1), "scale": (c,), "bias": (c,)}
    assert_refused(
        lambda: gn.plan(shapes, {"T": "float16"}, attrs={"num_groups": c}, caps=caps),
        gn.OP,
        ("num_groups", "x", "X"),
        what="num_groups = C = 2**33",
    )


# (op, attribute, an int value that is accepted, the bool of the same value)
BOOL_ATTRS = [
    ("gn", "num_groups", 1, True),
    ("gn", "num_groups", 1, np.True_),
    ("gn", "stash_type", 1, True),
    ("sgn", "groups", 1, True),
    ("sgn", "activation", 0, False),
    ("sgn", "activation", 1, True),
    ("sgn", "channels_last", 1, True),
    ("sgn", "channels_last", 0, False),
    ("mgn", "groups", 1, True),
    ("mgn", "activation", 1, True),
    ("mgn", "channels_last", 0, False),
    ("bn", "training_mode", 0, False),
    ("bn", "epsilon", 1.0, True),
    ("in", "epsilon", 1.0, True),
]


def _inputs_for_attr(info, name, value):
    if info.name in ("sgn", "mgn") and name == "channels_last" and value == 0:
        # (N, C, H, W): C = 4
        shape = (2, 4, 3, 2)
        rng = np.random.default_rng(1)
        x = rng.standard_normal(shape).astype(np.float32)
        c = np.ones(4, np.float32)
        return {"X": x, "gamma": c, "beta": c, **({"skip": x} if info.name == "sgn" else {})}
    return info.inputs()


@pytest.mark.parametrize(
    "op_id,name,good,bad", BOOL_ATTRS, ids=[f"{o}-{n}-{g!r}-{b!r}" for o, n, g, b in BOOL_ATTRS]
)
def test_bool_attribute_is_refused_even_after_the_int_call(op_id, name, good, bad):
    info = OPS[op_id]
    inputs = _inputs_for_attr(info, name, good)
    shapes = {k: v.shape for k, v in inputs.items()}
    attrs = {name: good}
    plan(info, shapes, attrs=attrs)  # accepted (and cached)
    kernel(info, inputs, attrs=attrs)
    what = f"{name}={bad!r} after {name}={good!r}"
    assert_refused(lambda: plan(info, shapes, attrs={name: bad}), info.op, (name,), what="plan() " + what)
    assert_refused(lambda: kernel(info, inputs, attrs={name: bad}), info.op, (name,), what="kernel() " + what)


@ALL_OPS
@pytest.mark.parametrize("bad", [True, np.True_], ids=["True", "np.True_"])
def test_bool_tunable_is_refused_even_after_the_int_call(op_id, bad):
    info = OPS[op_id]
    inputs = info.inputs()
    shapes = info.shapes()
    plan(info, shapes, tunables={"WORKGROUP_SIZE": 1})
    kernel(info, inputs, tunables={"WORKGROUP_SIZE": 1})
    what = f"WORKGROUP_SIZE={bad!r} after WORKGROUP_SIZE=1"
    assert_refused(
        lambda: plan(info, shapes, tunables={"WORKGROUP_SIZE": bad}),
        info.op,
        ("WORKGROUP_SIZE",),
        what="plan() " + what,
    )
    assert_refused(
        lambda: kernel(info, inputs, tunables={"WORKGROUP_SIZE": bad}),
        info.op,
        ("WORKGROUP_SIZE",),
        what="kernel() " + what,
    )


# =========================================================================================================
# Big-endian numpy input: converted on upload, the same result as little-endian


@ALL_OPS
@DTYPES
@pytest.mark.parametrize("which", ["first", "all"])
def test_big_endian_input_gives_the_little_endian_result(op_id, dtype, which):
    info = OPS[op_id]
    inputs = info.inputs(dtype, rng=np.random.default_rng(7))
    expected = kernel(info, inputs)[info.out_key]
    swapped = dict(inputs)
    for key in list(swapped) if which == "all" else [info.keys[0]]:
        swapped[key] = swapped[key].astype(swapped[key].dtype.newbyteorder(">"))
        assert swapped[key].dtype.byteorder == ">" and np.array_equal(swapped[key], inputs[key])
    got = kernel(info, swapped)[info.out_key]
    assert got.shape == expected.shape and got.dtype.name == expected.dtype.name
    np.testing.assert_array_equal(np.asarray(got, expected.dtype), expected)


# =========================================================================================================
# Empty tensors: outputs of the contract's shape, no dispatch, a plan with no passes, every variant

EMPTY_SHAPES = {
    "bn": [(0, 3), (2, 0, 4), (2, 3, 0), (0, 4, 5, 5)],
    "gn": [(2, 6, 0, 3), (0, 6, 4), (2, 0, 4)],
    "in": [(2, 6, 0, 3), (0, 6, 4), (2, 0, 4)],
    "sgn": [(0, 2, 3, 4), (2, 0, 3, 4), (2, 2, 0, 4), (2, 2, 3, 0)],
    "mgn": [(0, 2, 3, 4), (2, 0, 3, 4), (2, 2, 0, 4), (2, 2, 3, 0)],
    **{op_id: [(0, 4, 3), (2, 0, 3), (2, 4, 0)] for op_id in ("ln", "rms", "sln", "skln", "sksln")},
}
EMPTY_CASES = [
    (op_id, variant, shape)
    for op_id in OP_IDS
    for variant in (None,) + OPS[op_id].variants
    for shape in EMPTY_SHAPES[op_id]
]


def _empty_request(info, variant, shape, dtype):
    rng = np.random.default_rng(3)
    # SkipGroupNorm: a forced variant with a bias and S, the natural choice without them.
    with_bias = info.name == "sgn" and variant is not None
    inputs = info.inputs(dtype, shape=shape, rng=rng, with_optional=with_bias)
    attrs = dict(info.attrs)
    outputs = None
    if variant == "group_stash_f16_serial":
        attrs["stash_type"] = 10
    if info.name == "sgn" and variant is not None:
        outputs = ("Y", "S")
    return inputs, attrs, outputs


@pytest.mark.parametrize(
    "op_id,variant,shape",
    EMPTY_CASES,
    ids=[f"{o}-{v or 'default'}-{'x'.join(map(str, s))}" for o, v, s in EMPTY_CASES],
)
def test_empty_inputs_give_empty_outputs_with_no_passes(op_id, variant, shape):
    info = OPS[op_id]
    caps = {"features": ["shader-f16", "subgroups"]}  # a forced variant's features are not the point
    problems = []
    for dtype in (np.float32, np.float16):
        inputs, attrs, outputs = _empty_request(info, variant, shape, dtype)
        shapes = {k: v.shape for k, v in inputs.items()}
        what = f"{np.dtype(dtype).name}"
        try:
            result = info.module.kernel(inputs, attrs=attrs, variant=variant, outputs=outputs)
            for key, value in result.items():
                if not (
                    isinstance(value, np.ndarray)
                    and value.shape == tuple(shape)
                    and value.dtype == np.dtype(dtype)
                ):
                    problems.append(f"{what}: kernel() output {key} is {summary(value)}")
        except Exception as error:  # noqa: BLE001 - reported below with the plan's outcome
            problems.append(
                f"{what}: kernel() raised {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            )
        try:
            p = info.module.plan(
                shapes, info.dtypes(dtype), attrs=attrs, variant=variant, outputs=outputs, caps=caps
            )
            if p.passes != ():
                problems.append(f"{what}: plan() {p.variant} has {len(p.passes)} passes, expected none")
        except Exception as error:  # noqa: BLE001
            problems.append(
                f"{what}: plan() raised {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            )
    assert not problems, f"{op_id} {variant or 'default variant'} {shape}:\n" + "\n".join(problems)


@ALL_OPS
def test_empty_tensors_in_give_empty_tensors_out(op_id):
    info = OPS[op_id]
    shape = EMPTY_SHAPES[op_id][0]
    inputs = {k: Tensor.from_numpy(v) for k, v in info.inputs(shape=shape).items()}
    result = kernel(info, inputs)[info.out_key]
    assert isinstance(result, Tensor) and result.shape == tuple(shape), summary(result)
    assert result.numpy().shape == tuple(shape)


def test_empty_group_normalization_plain_function():
    """issue 9's example: (2, 6, 0, 3) is a GPUValidationError today."""
    x = np.zeros((2, 6, 0, 3), np.float32)
    y = gn.group_normalization(x, np.ones(6, np.float32), np.zeros(6, np.float32), num_groups=2)
    assert y.shape == (2, 6, 0, 3) and y.dtype == np.float32


# =========================================================================================================
# Inputs that are not float32 / float16 arrays: object dtype, ragged lists, strings

ODD_VALUES = {
    "object_array": lambda v: np.array(list(v.ravel()), dtype=object).reshape(v.shape),
    "object_array_of_none": lambda v: np.array([None] * v.size, dtype=object).reshape(v.shape),
    "ragged_list": lambda v: [[1.0], [1.0, 2.0]],
    "string": lambda v: "abc",
    "float64_list": lambda v: v.astype(np.float64).tolist(),
    "int32_array": lambda v: v.astype(np.int32),
    "dict": lambda v: {"data": v},
}


@ALL_OPS
@pytest.mark.parametrize("odd", list(ODD_VALUES))
def test_input_that_is_not_a_float_array(op_id, odd):
    info = OPS[op_id]
    inputs = info.inputs()
    key = next(k for k in info.keys[2:] + info.keys[1:2] if k in inputs)  # a required parameter
    inputs[key] = ODD_VALUES[odd](inputs[key])
    words = ("object",) if odd.startswith("object") else ()
    assert_refused(lambda: kernel(info, inputs), info.op, (key,), words, f"{key} = {odd}")


# =========================================================================================================
# The caller's name for an input: the bind key or the ONNX role, whichever the call used

# (op, bind key, a wrong value for it, ...)
NAME_CASES = [
    ("bn", "x", lambda v: v[:, :, 0][:, 0]),  # rank 1
    ("bn", "b", lambda v: v[:3]),
    ("bn", "inputMean", lambda v: v[:3]),
    ("bn", "inputVar", lambda v: v.reshape(2, 2)),
    ("gn", "x", lambda v: v[:, :, 0]),  # rank 2
    ("in", "b", lambda v: v[:3]),
]


@pytest.mark.parametrize("op_id,key,wrong", NAME_CASES, ids=[f"{o}-{k}" for o, k, _ in NAME_CASES])
@pytest.mark.parametrize("by_role", [False, True], ids=["key", "role"])
def test_errors_use_the_callers_name(op_id, key, wrong, by_role):
    info = OPS[op_id]
    inputs = info.inputs()
    inputs[key] = wrong(inputs[key])
    name = key
    if by_role:
        name = info.roles[key]
        inputs[name] = inputs.pop(key)
    other = info.roles[key] if not by_role else key
    error = assert_refused(
        lambda: kernel(info, inputs), info.op, (name,), what=f"{name} of shape {np.shape(inputs[name])}"
    )
    assert not word(
        f"input {other}", str(error)
    ), f"the caller said {name}, the error says input {other}: {error}"


# =========================================================================================================
# Found while writing these tests; not on issue 9's list, same rule: ContractError or the right answer


@ALL_OPS
@pytest.mark.parametrize("bad", [0.5, True], ids=["fraction", "bool"])
def test_tensor_with_a_non_integer_dim_is_refused(op_id, bad):
    """Tensor(buffer, shape, ...) truncates its dims with int(): a (2, 4, 2.5) Tensor runs as (2, 4, 2)."""
    info = OPS[op_id]
    inputs = info.inputs()
    key = info.keys[0]
    x = inputs[key]
    info.loose_skip(inputs)  # a skip valid whatever X's free axis is
    t = Tensor.from_numpy(x)
    shape = list(x.shape)
    axis = info.spatial_axis  # an axis no parameter reads: they must keep matching
    shape[axis] = True if bad is True else shape[axis] - bad
    shape = tuple(shape)

    # Refused where the Tensor is made, before any call can use it.
    with pytest.raises(ContractError) as caught:
        Tensor(t.buffer, shape, x.dtype, t.device)
    assert caught.value.op == "Tensor" and caught.value.subject == "shape", str(caught.value)
    assert f"dimension {shape[axis]!r}" in str(caught.value), str(caught.value)


@ALL_OPS
def test_inputs_that_are_not_a_mapping_are_refused(op_id):
    info = OPS[op_id]
    inputs = list(info.inputs().values())
    assert_refused(
        lambda: info.module.kernel(inputs, attrs=info.attrs),
        info.op,
        ("inputs",),
        what="kernel() inputs as a list",
        names_in="text",
    )


@ALL_OPS
def test_big_endian_tensor_input(op_id):
    """Tensor.from_numpy of a big-endian array keeps the big-endian bytes and dtype: the call must give
    the little-endian result or refuse it with a ContractError, never read the bytes the wrong way."""
    info = OPS[op_id]
    inputs = info.inputs(rng=np.random.default_rng(9))
    expected = kernel(info, inputs)[info.out_key]
    key = info.keys[0]
    swapped = {**inputs, key: Tensor.from_numpy(inputs[key].astype(">f4"))}
    try:
        got = kernel(info, swapped)[info.out_key]
    except ContractError:
        return
    np.testing.assert_array_equal(got, expected)
