# SPDX-License-Identifier: Apache-2.0
"""Float64 NumPy definitions of every normalization op of the ONNX family, written from the ONNX and
ONNX Runtime operator definitions (not from the kernels): `check_model`'s judge and the tests' oracle.

Each function computes in float64, except where the definition itself prescribes lower precision
(GroupNormalization's `stash_type=10`, SkipGroupNorm's rounding of the residual sum to T), so a
kernel is judged against the mathematical result rather than another implementation's rounding.
Functions return float64 arrays; a function of an op with several outputs returns all of them, in
the op's output order, whether a caller asks for them or not.

`node_outputs(domain, op_type, inputs, attrs)` runs a node given its inputs by position (None for
an omitted optional one) and its attributes as `onnx_nodes.node_attributes` reads them.

Needs only numpy, as the kernels.
"""

from __future__ import annotations

import numpy as np

F16_ONNX_CODE = 10  # TensorProto.FLOAT16: GroupNormalization's stash_type for float16 statistics


def _per_channel(values, ndim: int) -> np.ndarray:
    """A (C,) parameter as float64, shaped to broadcast over axis 1 of an (N, C, ...) tensor."""
    return np.asarray(values, np.float64).reshape((1, -1) + (1,) * (ndim - 2))


def _swish(y):
    return y / (1.0 + np.exp(-y))


def batch_normalization(x, scale, b, mean, var, epsilon=1e-5) -> np.ndarray:
    """ONNX BatchNormalization-15 (and 9, 14), inference mode, for X of shape (N, C, D1, ..., Dn),
    or (N,), for which "C is assumed to be 1"."""
    x = np.asarray(x, np.float64)
    if x.ndim == 1:
        return batch_normalization(x.reshape(-1, 1), scale, b, mean, var, epsilon).reshape(x.shape)
    if x.ndim < 1:
        raise ValueError(f"BatchNormalization needs rank >= 1, got shape {x.shape}")
    scale, b, mean, var = (_per_channel(p, x.ndim) for p in (scale, b, mean, var))
    return (x - mean) / np.sqrt(var + epsilon) * scale + b


def group_normalization(x, scale, bias, num_groups, epsilon=1e-5, stash_type=1) -> np.ndarray:
    """ONNX GroupNormalization-21 with scale and bias of shape (C,).

    `stash_type=1` is the exact (float64) result. `stash_type=10` follows the ONNX function body
    step by step: X is cast to float16, the group statistics are `E[x^2] - E[x]^2` and the
    normalization runs in float16 arithmetic exactly as onnx's ReferenceEvaluator executes that
    body, and the normalized values are cast back to X's type before scale and bias are applied.
    """
    x = np.asarray(x)
    n, channels = x.shape[:2]
    if channels % num_groups:
        raise ValueError(f"num_groups={num_groups} does not divide C={channels}")
    if stash_type == 1:
        rows = x.astype(np.float64).reshape(n, num_groups, -1)
        mean = rows.mean(axis=2, keepdims=True)
        var = rows.var(axis=2, keepdims=True)
        normalized = (rows - mean) / np.sqrt(var + epsilon)
    elif stash_type == F16_ONNX_CODE:
        rows = x.astype(np.float16).reshape(n, num_groups, -1)
        # ReduceMean is np.mean(..., dtype=input dtype) in the ReferenceEvaluator;
        # the same call reproduces its float16 rounding.
        mean = np.mean(rows, axis=2, keepdims=True, dtype=np.float16)
        mean_of_square = np.mean(rows * rows, axis=2, keepdims=True, dtype=np.float16)
        var = mean_of_square - mean * mean
        # The body builds epsilon as a float32 constant and casts it to float16.
        std = np.sqrt(var + np.float32(epsilon).astype(np.float16))
        normalized = ((rows - mean) / std).astype(x.dtype)
    else:
        raise ValueError(f"stash_type must be 1 or 10, got {stash_type}")
    normalized = normalized.reshape(x.shape).astype(np.float64)
    return _per_channel(scale, x.ndim) * normalized + _per_channel(bias, x.ndim)


def group_normalization_18(x, scale, bias, num_groups, epsilon=1e-5) -> np.ndarray:
    """ONNX GroupNormalization-18: scale and bias of shape (num_groups,), one value per group."""
    per_group = np.asarray(x).shape[1] // num_groups
    return group_normalization(
        x, np.repeat(scale, per_group), np.repeat(bias, per_group), num_groups, epsilon
    )


def instance_normalization(x, scale, b, epsilon=1e-5) -> np.ndarray:
    """ONNX InstanceNormalization-6: statistics per (batch item, channel) over all spatial axes."""
    x = np.asarray(x, np.float64)
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * _per_channel(scale, x.ndim) + _per_channel(b, x.ndim)


def _channel_groups_normalized(s, gamma, beta, groups, epsilon, activation, channels_last) -> np.ndarray:
    """The group normalization the com.microsoft ops share: `s` (float64, NHWC when channels_last
    else NCHW, or any rank with channels at axis 1 / last) normalized per (batch item, group),
    scaled by gamma, shifted by beta, Swish when `activation` is 1; in `s`'s layout."""
    n, channels = (s.shape[0], s.shape[-1]) if channels_last else s.shape[:2]
    if channels % groups:
        raise ValueError(f"groups={groups} does not divide C={channels}")
    # Statistics and the affine transform in (N, C, spatial) form.
    s_ncs = s.reshape(n, -1, channels).transpose(0, 2, 1) if channels_last else s.reshape(n, channels, -1)
    rows = s_ncs.reshape(n, groups, -1)
    mean = rows.mean(axis=2, keepdims=True)
    var = rows.var(axis=2, keepdims=True)
    normalized = ((rows - mean) / np.sqrt(var + epsilon)).reshape(s_ncs.shape)
    y = np.asarray(gamma, np.float64)[:, None] * normalized + np.asarray(beta, np.float64)[:, None]
    if activation == 1:
        y = _swish(y)
    return y.transpose(0, 2, 1).reshape(s.shape) if channels_last else y.reshape(s.shape)


def microsoft_group_norm(X, gamma, beta, groups, epsilon=1e-5, activation=0, channels_last=1) -> np.ndarray:
    """com.microsoft GroupNorm (ONNX Runtime contrib): X of shape (N, H, W, C) when channels_last
    (the default) else (N, C, H, W); gamma and beta (C,) of their own float type."""
    x = np.asarray(X, np.float64)
    return _channel_groups_normalized(x, gamma, beta, groups, epsilon, activation, channels_last)


def skip_group_norm(X, gamma, beta, skip, bias, groups, epsilon, activation, channels_last, t_dtype):
    """com.microsoft SkipGroupNorm. Returns (Y, S), both float64 in X's layout.

    `skip` is X-shaped, or (N, C) / (N, 1, 1, C) with one value per batch item and channel;
    `bias` is (C,) or None. S is rounded to `t_dtype` (X's type) before the statistics see it, as
    the operator specifies.
    """
    x = np.asarray(X, np.float64)
    n, channels = (x.shape[0], x.shape[-1]) if channels_last else x.shape[:2]
    per_item_shape = (n, 1, 1, channels) if channels_last else (n, channels, 1, 1)
    skip = np.asarray(skip, np.float64)
    s = x + (skip if skip.shape == x.shape else skip.reshape(per_item_shape))
    if bias is not None:
        bias_shape = (1, 1, 1, channels) if channels_last else (1, channels, 1, 1)
        s = s + np.asarray(bias, np.float64).reshape(bias_shape)
    s = s.astype(np.dtype(t_dtype)).astype(np.float64)
    return _channel_groups_normalized(s, gamma, beta, groups, epsilon, activation, channels_last), s


def _trailing_axes(x, axis: int) -> tuple:
    """The axes [axis, rank) a layer normalization reduces over (a negative axis counts from the end)."""
    rank = x.ndim
    if not -rank <= axis < rank:
        raise ValueError(f"axis={axis} is outside [-{rank}, {rank}) for rank {rank}")
    return tuple(range(axis % rank, rank))


def layer_normalization(X, Scale, B=None, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX LayerNormalization-17. Returns (Y, Mean, InvStdDev); Mean and InvStdDev have X's shape
    with the normalized axes kept as 1. Scale and B broadcast to the normalized shape (the function
    body multiplies and adds with ONNX broadcasting). stash_type only sets the precision of the
    computation, which is exact here."""
    x = np.asarray(X, np.float64)
    axes = _trailing_axes(x, axis)
    mean = x.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + epsilon)
    y = (x - mean) * inv_std * np.asarray(Scale, np.float64)
    if B is not None:
        y = y + np.asarray(B, np.float64)
    return y, mean, inv_std


def rms_normalization(X, scale, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX RMSNormalization-23 (and ONNX Runtime's SimplifiedLayerNormalization, which adds the
    inv_std_var output). Returns (Y, InvStdDev): `Y = X / sqrt(mean(X^2) + epsilon) * scale` over
    the axes [axis, rank)."""
    x = np.asarray(X, np.float64)
    axes = _trailing_axes(x, axis)
    inv_std = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + epsilon)
    return x * inv_std * np.asarray(scale, np.float64), inv_std


def _skip_sum(input, skip, bias):
    """input + skip (+ bias), float64: skip is input-shaped or broadcasts to it ((S, H), (1, S, H))."""
    total = np.asarray(input, np.float64) + np.asarray(skip, np.float64)
    return total if bias is None else total + np.asarray(bias, np.float64)


def skip_layer_normalization(input, skip, gamma, beta=None, bias=None, epsilon=1e-12):
    """com.microsoft SkipLayerNormalization: layer normalization of `input + skip (+ bias)` over the
    last axis. Returns (output, mean, inv_std_var, input_skip_bias_sum). The statistics see the sum
    unrounded (ONNX Runtime's kernels keep it in float); the sum output is rounded to T by the caller."""
    total = _skip_sum(input, skip, bias)
    output, mean, inv_std = layer_normalization(total, gamma, beta, axis=-1, epsilon=epsilon)
    return output, mean, inv_std, total


def skip_simplified_layer_normalization(input, skip, gamma, bias=None, epsilon=1e-12):
    """com.microsoft SkipSimplifiedLayerNormalization: RMS normalization of `input + skip (+ bias)`
    over the last axis. Returns (output, mean, inv_std_var, input_skip_bias_sum); ONNX Runtime
    declares `mean` but never writes it, so it is None here."""
    total = _skip_sum(input, skip, bias)
    output, inv_std = rms_normalization(total, gamma, axis=-1, epsilon=epsilon)
    return output, None, inv_std, total


def _attribute(attrs: dict, name: str, default):
    value = attrs.get(name)
    return default if value is None else value


def _layer_attributes(attrs: dict) -> dict:
    return {
        "axis": _attribute(attrs, "axis", -1),
        "epsilon": _attribute(attrs, "epsilon", 1e-5),
        "stash_type": _attribute(attrs, "stash_type", 1),
    }


def _channel_group_attributes(attrs: dict) -> dict:
    return {
        "groups": attrs["groups"],
        "epsilon": _attribute(attrs, "epsilon", 1e-5),
        "activation": _attribute(attrs, "activation", 0),
        "channels_last": _attribute(attrs, "channels_last", 1),
    }


def _skip_group_norm_node(inputs, attrs):
    x, gamma, beta, skip, bias = inputs[:5]
    group = _channel_group_attributes(attrs)
    return skip_group_norm(
        x,
        gamma,
        beta,
        skip,
        bias,
        group["groups"],
        group["epsilon"],
        group["activation"],
        group["channels_last"],
        np.asarray(x).dtype,
    )


# (domain, op type) -> function of (inputs by position, padded with None; attributes) -> outputs;
# (domain, op type, version) where an earlier version of an op means something else.
# The com.microsoft ops default epsilon to 1e-12 (SkipLayerNormalization's and
# SkipSimplifiedLayerNormalization's schemas), the others to 1e-5.
_NODES = {
    ("ai.onnx", "BatchNormalization"): lambda i, a: [
        batch_normalization(*i[:5], epsilon=_attribute(a, "epsilon", 1e-5))
    ],
    ("ai.onnx", "GroupNormalization", 18): lambda i, a: [
        group_normalization_18(*i[:3], a["num_groups"], _attribute(a, "epsilon", 1e-5))
    ],
    ("ai.onnx", "GroupNormalization"): lambda i, a: [
        group_normalization(
            *i[:3], a["num_groups"], _attribute(a, "epsilon", 1e-5), _attribute(a, "stash_type", 1)
        )
    ],
    ("ai.onnx", "InstanceNormalization"): lambda i, a: [
        instance_normalization(*i[:3], epsilon=_attribute(a, "epsilon", 1e-5))
    ],
    ("ai.onnx", "LayerNormalization"): lambda i, a: layer_normalization(*i[:3], **_layer_attributes(a)),
    ("ai.onnx", "SimplifiedLayerNormalization"): lambda i, a: rms_normalization(
        *i[:2], **_layer_attributes(a)
    ),
    ("com.microsoft", "SimplifiedLayerNormalization"): lambda i, a: rms_normalization(
        *i[:2], **_layer_attributes(a)
    ),
    ("ai.onnx", "RMSNormalization"): lambda i, a: rms_normalization(*i[:2], **_layer_attributes(a))[:1],
    ("com.microsoft", "SkipLayerNormalization"): lambda i, a: skip_layer_normalization(
        *i[:5], epsilon=_attribute(a, "epsilon", 1e-12)
    ),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): lambda i, a: skip_simplified_layer_normalization(
        *i[:4], epsilon=_attribute(a, "epsilon", 1e-12)
    ),
    ("com.microsoft", "GroupNorm"): lambda i, a: [
        microsoft_group_norm(*i[:3], **_channel_group_attributes(a))
    ],
    ("com.microsoft", "SkipGroupNorm"): _skip_group_norm_node,
}


def node_outputs(domain: str, op_type: str, inputs: list, attrs: dict, version: int | None = None) -> list:
    """The float64 outputs of one node, in the op's output order (None for one the op never
    writes); `inputs` by position, None for an omitted optional input; `version`: the op version
    (since_version) the node is, None for the newest."""
    key = (domain or "ai.onnx", op_type)
    if key not in _NODES:
        raise ValueError(f"no reference for {key[0]} {op_type}")
    padded = list(inputs) + [None] * 8
    return list(_NODES.get((*key, version), _NODES[key])(padded, attrs))


def ops_with_reference() -> set:
    """The (domain, op type) of every op `node_outputs` runs."""
    return {key[:2] for key in _NODES}
