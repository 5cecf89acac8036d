"""com.microsoft SkipGroupNorm's contract: every rule refused with a ContractError that names the op,
the input or attribute and the rule, before any GPU work (a bias of T, not M; NCHW's skip shapes;
requests no variant can serve); and the rule natural selection follows between split and fused.
"""

from __future__ import annotations

import numpy as np
import pytest

from generated import ContractError
from generated import skip_group_norm as sgn
from tests.kernels.skip_group_norm_support import F16_CAPS


# --- contract errors, each before any GPU work ---------------------------------------------------------------


def good(channels_last=1, t=np.float32, m=np.float32):
    shape = (2, 3, 4, 8) if channels_last else (2, 8, 3, 4)
    return {
        "X": np.ones(shape, t),
        "gamma": np.ones(8, m),
        "beta": np.zeros(8, m),
        "skip": np.ones(shape, t),
        "bias": np.zeros(8, t),
    }


ATTRS = {"groups": 4, "activation": 1}


@pytest.mark.parametrize(
    "change,attrs,subject,words",
    [
        (
            {"skip": np.ones((2, 8, 1, 1), np.float32)},
            ATTRS,
            "input skip",
            "sameShape(shapes.skip, shapes.X)",
        ),
        ({"skip": np.ones((2, 3, 4), np.float32)}, ATTRS, "input skip", "shapes.skip = (2, 3, 4)"),
        ({"skip": np.ones((1, 8), np.float32)}, ATTRS, "input skip", "shapes.skip = (1, 8)"),
        (
            {"skip": np.ones((2, 9), np.float32)},
            ATTRS,
            "input skip",
            "shapes.skip = (2, 9), shapes.X = (2, 3, 4, 8)",
        ),
        ({"skip": np.ones((2, 3, 4, 1), np.float32)}, ATTRS, "input skip", "shapes.skip = (2, 3, 4, 1)"),
        ({"skip": np.ones((2, 1, 1, 9), np.float32)}, ATTRS, "input skip", "gnChannels = 8"),
        ({"skip": np.ones(8, np.float32)}, ATTRS, "input skip", "[dim(shapes.X, 0), 1, 1, gnChannels]"),
        (
            {"X": np.ones((2, 12, 8), np.float32), "skip": np.ones((2, 8), np.float32)},
            ATTRS,
            "input X",
            "ranks.X == 4",
        ),
        (
            {"X": np.ones((2, 3, 4, 2, 8), np.float32), "skip": np.ones((2, 8), np.float32)},
            ATTRS,
            "input X",
            "ranks.X == 4",
        ),
        ({}, {"groups": 3, "activation": 1}, "attribute groups", "% attrs.groups) == 0"),
        ({}, {"groups": 0, "activation": 1}, "attribute groups", "attrs.groups >= 1"),
        ({}, {"groups": -4, "activation": 1}, "attribute groups", "attrs.groups >= 1"),
        ({}, {"groups": 2.5, "activation": 1}, "attribute groups", "expected an integer"),
        ({}, {"groups": 4, "activation": 2}, "attribute activation", "not supported (allowed: 0, 1)"),
        ({}, {"groups": 4, "activation": -1}, "attribute activation", "not supported (allowed: 0, 1)"),
        ({}, {"activation": 1}, "attribute groups", "required"),
        ({}, {"groups": 4}, "attribute activation", "required"),
        ({}, {**ATTRS, "alpha": 1.0}, "attribute alpha", "unknown attribute"),
        ({"gamma": np.ones(9, np.float32)}, ATTRS, "input gamma", "dim(shapes.gamma, 0) == gnChannels"),
        ({"beta": np.ones(4, np.float32)}, ATTRS, "input beta", "dim(shapes.beta, 0) == gnChannels"),
        ({"gamma": np.ones((8, 1), np.float32)}, ATTRS, "input gamma", "ranks.gamma == 1"),
        ({"beta": np.ones((1, 8), np.float32)}, ATTRS, "input beta", "ranks.beta == 1"),
        ({"bias": np.ones(7, np.float32)}, ATTRS, "input bias", "dim(shapes.bias, 0) == gnChannels"),
        ({"bias": np.ones((8, 1), np.float32)}, ATTRS, "input bias", "ranks.bias == 1"),
        ({"X": np.ones((2, 3, 4, 8), np.float64)}, ATTRS, "input X", "float64 is not supported"),
    ],
)
def test_contract_errors_name_op_subject_and_rule(change, attrs, subject, words):
    inputs = {**good(), **change}
    with pytest.raises(ContractError) as caught:
        sgn.kernel(inputs, attrs=attrs)
    text = str(caught.value)
    assert text.startswith("com.microsoft SkipGroupNorm-1: ") and subject in text and words in text, text
    assert isinstance(caught.value, ValueError)


def test_bias_must_have_t_not_m():
    """bias is of type T: an f32 bias with f16 X (and f32 gamma/beta, type M) is refused."""
    inputs = {**good(t=np.float16, m=np.float32), "bias": np.zeros(8, np.float32)}
    with pytest.raises(ContractError, match="input bias.*every T tensor must share one dtype"):
        sgn.kernel(inputs, attrs=ATTRS)
    inputs = {**good(t=np.float32, m=np.float16), "bias": np.zeros(8, np.float16)}
    with pytest.raises(ContractError, match="input bias.*every T tensor must share one dtype"):
        sgn.kernel(inputs, attrs=ATTRS)


def test_nchw_refuses_an_nc11_skip_but_takes_n11c():
    """The broadcast forms are (N, C) and (N, 1, 1, C) in either layout; (N, C, 1, 1) is not one."""
    inputs = good(channels_last=0)
    attrs = {**ATTRS, "channels_last": 0}
    with pytest.raises(ContractError, match="input skip"):
        sgn.kernel({**inputs, "skip": np.ones((2, 8, 1, 1), np.float32)}, attrs=attrs)
    shapes = {k: v.shape for k, v in inputs.items()}
    sgn.plan({**shapes, "skip": (2, 1, 1, 8)}, {"T": "float32", "M": "float32"}, attrs=attrs)
    sgn.plan({**shapes, "skip": (2, 8)}, {"T": "float32", "M": "float32"}, attrs=attrs)


def test_requests_the_variants_cannot_serve_are_refused():
    shapes = {k: v.shape for k, v in good().items()}
    dtypes = {"T": "float32", "M": "float32"}
    with pytest.raises(ContractError, match="known output"):
        sgn.plan(shapes, dtypes, attrs=ATTRS, outputs=("Y", "Z"))
    with pytest.raises(ContractError, match="does not apply: needs device feature subgroups"):
        sgn.plan(shapes, dtypes, attrs=ATTRS, outputs=("Y", "S"), variant="registers", caps={"features": []})
    with pytest.raises(
        ContractError, match="unknown variant 'split_bias_sum'; known: registers, fused, split"
    ):
        sgn.plan(shapes, dtypes, attrs=ATTRS, variant="split_bias_sum")  # a flavour is not a variant
    with pytest.raises(ContractError, match="required input"):
        sgn.plan({k: v for k, v in shapes.items() if k != "skip"}, dtypes, attrs=ATTRS)


def test_selection_rule():
    """Fused unless rows = N * groups < SPLIT_MAX_ROWS (512) and a group holds >= SPLIT_MIN_GROUP_VALUES (32768)."""

    def family(shape, groups, channels_last=1, **kwargs):
        c = shape[3] if channels_last else shape[1]
        shapes = {"X": shape, "gamma": (c,), "beta": (c,), "skip": shape}
        attrs = {"groups": groups, "activation": 0, "channels_last": channels_last}
        return sgn.plan(
            shapes, {"T": "float16", "M": "float32"}, attrs=attrs, caps=F16_CAPS, **kwargs
        ).variant.split("_")[0]

    assert family((2, 64, 64, 320), 32) == "split"  # 64 rows of 40960
    assert family((2, 32, 32, 640), 32) == "fused"  # 64 rows of 20480
    assert family((2, 16, 16, 1280), 32) == "fused"  # 64 rows of 10240
    assert family((2, 320, 64, 64), 32, channels_last=0) == "split"
    assert family((2, 16, 16, 256), 32) == "fused"  # 2048 values a group
    assert family((16, 64, 64, 320), 32) == "fused"  # 512 rows
    assert family((15, 64, 64, 320), 32) == "split"  # 480 rows
    assert family((1, 32, 32, 32), 1) == "split"  # 32768 values
    assert family((1, 32, 32, 31), 1) == "fused"  # 31744
    assert family((1, 16, 16, 32), 1, tunables={"SPLIT_MIN_GROUP_VALUES": 8192}) == "split"
    assert family((2, 16, 16, 1280), 32, tunables={"SPLIT_MAX_ROWS": 1}) == "fused"
