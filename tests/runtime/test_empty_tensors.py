"""Zero-size inputs: outputs of the contract's (empty) shapes, no dispatch, for every op and variant.

Forcing a variant on an empty request is allowed: the plan has no passes whatever the variant, so
no variant's own rules (vec4 widths, split sizes) can refuse a request with nothing to compute.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import batch_normalization as bn
from generated import group_norm as mgn
from generated import group_normalization as gn
from generated import instance_normalization as inn
from generated import skip_group_norm as sgn
from generated._runtime import ContractError, Tensor

DTYPES = [np.float32, np.float16]


def bn_inputs(shape, dtype):
    c = shape[1]
    return {
        "x": np.ones(shape, dtype),
        **{k: np.ones(c, dtype) for k in ("scale", "b", "inputMean", "inputVar")},
    }, {}


def gn_inputs(shape, dtype, groups=2):
    c = shape[1]
    return {"x": np.ones(shape, dtype), "scale": np.ones(c, dtype), "bias": np.ones(c, dtype)}, {
        "num_groups": groups
    }


def in_inputs(shape, dtype):
    c = shape[1]
    return {"input": np.ones(shape, dtype), "scale": np.ones(c, dtype), "b": np.ones(c, dtype)}, {}


def sgn_inputs(shape, dtype, skip_form="full"):
    n, c = shape[0], shape[-1]
    skip = {"full": shape, "nc": (n, c), "n11c": (n, 1, 1, c)}[skip_form]
    inputs = {
        "X": np.ones(shape, dtype),
        "gamma": np.ones(c, dtype),
        "beta": np.ones(c, dtype),
        "skip": np.ones(skip, dtype),
        "bias": np.ones(c, dtype),
    }
    return inputs, {"groups": 2, "activation": 1}


def mgn_inputs(shape, dtype):
    """com.microsoft GroupNorm: NHWC when the last dim is 8 (C), else NCHW with C = 8 at axis 1;
    gamma and beta float32 whatever X is (M of its own)."""
    channels_last = int(shape[-1] == 8)
    c = shape[-1] if channels_last else shape[1]
    inputs = {"X": np.ones(shape, dtype), "gamma": np.ones(c, np.float32), "beta": np.ones(c, np.float32)}
    return inputs, {"groups": 2, "activation": 1, "channels_last": channels_last}


CASES = [
    (bn, bn_inputs, (0, 3)),
    (bn, bn_inputs, (2, 0, 4)),
    (bn, bn_inputs, (2, 4, 0, 5)),
    (bn, bn_inputs, (0, 4, 8, 8)),
    (gn, gn_inputs, (2, 6, 0, 3)),
    (gn, gn_inputs, (0, 6, 5, 3)),
    (gn, gn_inputs, (2, 0, 5, 3)),
    (gn, gn_inputs, (2, 4, 0)),
    (inn, in_inputs, (2, 6, 0, 3)),
    (inn, in_inputs, (0, 3, 8, 8)),
    (inn, in_inputs, (2, 0, 4)),
    (inn, in_inputs, (2, 3, 4, 0, 2)),
    (sgn, sgn_inputs, (0, 4, 4, 8)),
    (sgn, sgn_inputs, (2, 0, 4, 8)),
    (sgn, sgn_inputs, (2, 4, 0, 8)),
    (mgn, mgn_inputs, (0, 4, 4, 8)),
    (mgn, mgn_inputs, (2, 4, 0, 8)),
    (mgn, mgn_inputs, (2, 8, 0, 4)),
]
VARIANT_CASES = [(package, make, shape, c.ID) for package, make, shape in CASES for c in package.CANDIDATES]


def dtypes_of(package, dtype, inputs):
    """Each type variable's dtype, as the inputs of that type have it (`dtype` where none is given)."""
    found = {spec.type_var: inputs[spec.key].dtype.name for spec in package.INPUTS if spec.key in inputs}
    return {tv: found.get(tv, np.dtype(dtype).name) for tv in package.TYPE_CONSTRAINTS}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16"])
@pytest.mark.parametrize(
    "package,make,shape,variant",
    VARIANT_CASES,
    ids=[f"{p.__name__.split('.')[-1]}-{s}-{v}" for p, _, s, v in VARIANT_CASES],
)
def test_empty_input_gives_empty_outputs_without_dispatch(package, make, shape, variant, dtype):
    inputs, attrs = make(shape, dtype)
    outputs = tuple(t.key for t in package.OUTPUTS)
    plan = package.plan(
        {k: v.shape for k, v in inputs.items()},
        dtypes_of(package, dtype, inputs),
        attrs,
        caps={"features": ["shader-f16", "subgroups"]},
        variant=variant,
        outputs=outputs,
    )
    assert (
        plan.passes == ()
        and plan.intermediates == {}
        and plan.explanation[0].startswith("nothing to compute")
    ), plan
    result = package.kernel(inputs, attrs=attrs, variant=variant, outputs=outputs)
    for key in outputs:
        assert (
            isinstance(result[key], np.ndarray) and result[key].shape == shape and result[key].dtype == dtype
        ), key
    tensors = {k: Tensor.from_numpy(v) for k, v in inputs.items()}
    resident = package.kernel(tensors, attrs=attrs, variant=variant, outputs=outputs)
    for key in outputs:
        assert isinstance(resident[key], Tensor) and resident[key].shape == shape, key
        assert resident[key].numpy().shape == shape
    out = {key: Tensor.empty(shape, dtype) for key in outputs}
    written = package.kernel(tensors, attrs=attrs, variant=variant, outputs=outputs, out=out)
    assert all(written[key] is out[key] for key in outputs)


@pytest.mark.parametrize("skip_form", ["nc", "n11c"])
def test_empty_skip_group_norm_with_broadcast_skip(skip_form):
    inputs, attrs = sgn_inputs((0, 4, 4, 8), np.float32, skip_form)
    assert sgn.kernel(inputs, attrs=attrs)["Y"].shape == (0, 4, 4, 8)


def test_empty_requests_still_check_the_contract():
    inputs, attrs = gn_inputs((2, 6, 0, 3), np.float32, groups=4)  # 6 % 4 != 0
    with pytest.raises(ContractError, match="num_groups"):
        gn.kernel(inputs, attrs=attrs)
    inputs, attrs = bn_inputs((0, 3), np.float32)
    with pytest.raises(ContractError, match="input scale"):
        bn.kernel({**inputs, "scale": np.ones(4, np.float32)})
    with pytest.raises(ContractError, match="unknown variant"):
        bn.kernel(inputs, variant="nope")


def test_zero_element_tensor_over_a_zero_byte_buffer_is_fine():
    import wgpu

    from generated._runtime import default_device

    device = default_device()
    empty = device.create_buffer(size=0, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    inputs, attrs = in_inputs((2, 3, 0), np.float32)
    tensors = {k: Tensor(empty, v.shape, v.dtype, device) for k, v in inputs.items() if k == "input"}
    tensors.update({k: Tensor.from_numpy(v) for k, v in inputs.items() if k != "input"})
    assert inn.kernel(tensors)["output"].shape == (2, 3, 0)
