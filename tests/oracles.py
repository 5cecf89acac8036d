"""Reference implementations and helpers that kernel tests compare against.

The references are written from the ONNX / ONNX Runtime operator definitions and
compute in float64, except where the definition itself prescribes lower
precision (GroupNormalization's ``stash_type=10``, SkipGroupNorm's rounding of
the residual sum), so a kernel is judged against the mathematical result rather
than against another implementation's rounding.
"""

from __future__ import annotations

import functools
import os
import secrets
import warnings
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Absolute and relative tolerance per tensor element type (docs/TESTING.md).
TOLERANCES = {
    np.dtype(np.float32): (1e-5, 1e-4),
    np.dtype(np.float16): (2e-3, 2e-3),
}

# Besides numpy dtypes, accept the WGSL names the compiler uses. They must be
# mapped explicitly: np.dtype("f16") is a 16-byte float, not float16.
_WGSL_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}


def _tensor_dtype(dtype) -> np.dtype:
    # Not `get(...) or np.dtype(...)`: a dtype's truth value is its field count, 0.
    resolved = _WGSL_DTYPES[dtype] if dtype in _WGSL_DTYPES else np.dtype(dtype)
    if resolved not in TOLERANCES:
        raise ValueError(f"unsupported tensor dtype {dtype!r}: expected float32 or float16")
    return resolved


def _per_channel(values, ndim: int) -> np.ndarray:
    """A (C,) parameter as float64, shaped to broadcast over axis 1 of an (N, C, ...) tensor."""
    return np.asarray(values, np.float64).reshape((1, -1) + (1,) * (ndim - 2))


# ---------------------------------------------------------------------------
# References


def batch_normalization_ref(x, scale, b, mean, var, epsilon=1e-5) -> np.ndarray:
    """ONNX BatchNormalization-15, inference mode, for X of shape (N, C, D1, ..., Dn)."""
    x = np.asarray(x, np.float64)
    if x.ndim < 2:
        raise ValueError(f"BatchNormalization needs rank >= 2, got shape {x.shape}")
    scale, b, mean, var = (_per_channel(p, x.ndim) for p in (scale, b, mean, var))
    return (x - mean) / np.sqrt(var + epsilon) * scale + b


def group_normalization_ref(x, scale, bias, num_groups, epsilon=1e-5, stash_type=1) -> np.ndarray:
    """ONNX GroupNormalization-21 with scale and bias of shape (C,).

    ``stash_type=1`` is the exact (float64) result. ``stash_type=10`` follows the
    ONNX function body step by step: X is cast to float16, the group statistics
    are ``E[x^2] - E[x]^2`` and the normalization runs in float16 arithmetic
    exactly as onnx's ReferenceEvaluator executes that body, and the normalized
    values are cast back to X's type before scale and bias are applied.
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
    elif stash_type == 10:
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


def instance_normalization_ref(x, scale, b, epsilon=1e-5) -> np.ndarray:
    """ONNX InstanceNormalization-6: statistics per (batch item, channel) over all spatial axes."""
    x = np.asarray(x, np.float64)
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * _per_channel(scale, x.ndim) + _per_channel(b, x.ndim)


def skip_group_norm_ref(X, gamma, beta, skip, bias, groups, epsilon, activation, channels_last, t_dtype):
    """com.microsoft SkipGroupNorm. Returns (Y, S), both float64 in X's layout.

    ``skip`` is X-shaped, or (N, C) / (N, 1, 1, C) with one value per batch item
    and channel; ``bias`` is (C,) or None. S is rounded to ``t_dtype`` before the
    statistics see it, as the operator specifies.
    """
    t_dtype = _tensor_dtype(t_dtype)
    x = np.asarray(X, np.float64)
    n, channels = (x.shape[0], x.shape[3]) if channels_last else x.shape[:2]
    if channels % groups:
        raise ValueError(f"groups={groups} does not divide C={channels}")
    # Per-(batch, channel) terms broadcast as (N, 1, 1, C) or (N, C, 1, 1).
    per_channel_shape = (n, 1, 1, channels) if channels_last else (n, channels, 1, 1)

    skip = np.asarray(skip, np.float64)
    if skip.shape != x.shape:
        skip = skip.reshape(per_channel_shape)
    s = x + skip
    if bias is not None:
        bias_shape = (1, 1, 1, channels) if channels_last else (1, channels, 1, 1)
        s = s + np.asarray(bias, np.float64).reshape(bias_shape)
    s = s.astype(t_dtype).astype(np.float64)

    # Statistics and the affine transform in (N, C, spatial) form.
    s_ncs = s.reshape(n, -1, channels).transpose(0, 2, 1) if channels_last else s.reshape(n, channels, -1)
    rows = s_ncs.reshape(n, groups, -1)
    mean = rows.mean(axis=2, keepdims=True)
    var = rows.var(axis=2, keepdims=True)
    normalized = ((rows - mean) / np.sqrt(var + epsilon)).reshape(s_ncs.shape)
    y = np.asarray(gamma, np.float64)[:, None] * normalized + np.asarray(beta, np.float64)[:, None]
    if activation == 1:
        y = y / (1.0 + np.exp(-y))
    y = y.transpose(0, 2, 1).reshape(s.shape) if channels_last else y.reshape(s.shape)
    return y, s


# ---------------------------------------------------------------------------
# Other implementations of the same operators


def single_node_model(
    op_type, inputs: dict, attrs: dict, opset: int, outputs=("Y",), domain=""
) -> onnx.ModelProto:
    """A model holding one node; graph inputs are ``inputs``' keys with their arrays' dtypes and shapes.

    Output types are left for the runtime to infer. A non-default domain also
    imports ai.onnx, which runtimes expect of every model.
    """
    node = helper.make_node(op_type, list(inputs), list(outputs), domain=domain, **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
        for name, array in inputs.items()
    ]
    graph_outputs = [onnx.ValueInfoProto(name=name) for name in outputs]
    graph = helper.make_graph([node], op_type, graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid(domain, opset)]
    if domain not in ("", "ai.onnx"):
        opsets.append(helper.make_opsetid("", 21))
    # The lowest IR version that can carry these opsets: onnx stamps its newest
    # by default, which onnxruntime may not read yet.
    ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)


def onnxruntime_run(op_type, inputs: dict, attrs: dict, opset: int, outputs=("Y",), domain="") -> list:
    """Runs one node on onnxruntime's CPU provider; its errors (e.g. NOT_IMPLEMENTED) propagate."""
    import onnxruntime

    model = single_node_model(op_type, inputs, attrs, opset, outputs, domain)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # only errors: old opsets (InstanceNormalization-6) warn on every session
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(list(outputs), dict(inputs))


@functools.cache
def _node_test_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    # Building every case runs every operator's example generator; warnings
    # from unrelated operators' data (overflowing casts, log(0)) are noise here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


def backend_node_cases(prefix: str) -> list:
    """ONNX backend node tests whose name starts with ``prefix``, as (name, model, data_sets).

    data_sets is a list of (inputs, outputs), each a list of arrays in the
    model's input/output order. The ``*_expanded`` cases (the operator's
    function body as a multi-node graph, on the same data) are left out: they
    test the function body, not the operator.
    """
    cases = []
    for case in _node_test_cases():
        if case.name.startswith(prefix) and not case.name.endswith("_expanded"):
            data_sets = [
                ([_as_array(a) for a in ins], [_as_array(a) for a in outs]) for ins, outs in case.data_sets
            ]
            cases.append((case.name, case.model, data_sets))
    return cases


def _as_array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def pytorch_converted_cases(prefix: str) -> list:
    """The onnx wheel's ``pytorch-converted`` tests whose name starts with ``prefix``, as (name, model, data_sets).

    These models keep their parameters as initializers; a data set holds only
    the graph inputs that are not initialized.
    """
    root = Path(onnx.__file__).parent / "backend" / "test" / "data" / "pytorch-converted"
    cases = []
    for case_dir in sorted(root.glob(f"{prefix}*")):
        model = onnx.load(case_dir / "model.onnx")
        data_sets = [
            (_load_tensors(data_dir, "input"), _load_tensors(data_dir, "output"))
            for data_dir in sorted(case_dir.glob("test_data_set_*"), key=_numeric_suffix)
        ]
        cases.append((case_dir.name, model, data_sets))
    return cases


def _numeric_suffix(path: Path) -> int:
    return int(path.stem.rsplit("_", 1)[1])


def _load_tensors(data_dir: Path, kind: str) -> list:
    files = sorted(data_dir.glob(f"{kind}_*.pb"), key=_numeric_suffix)
    return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]


# ---------------------------------------------------------------------------
# Comparison


def tolerance_ok(actual, ref, dtype) -> np.ndarray:
    """Elementwise: |actual - ref| <= atol + rtol * |ref| for the tensor dtype; NaN in actual never passes."""
    atol, rtol = TOLERANCES[_tensor_dtype(dtype)]
    actual = np.asarray(actual, np.float64)
    ref = np.asarray(ref, np.float64)
    # A comparison with NaN is False, so NaN fails without a special case.
    return np.abs(actual - ref) <= atol + rtol * np.abs(ref)


def assert_close(actual, ref, dtype, context: str) -> None:
    """Fails with the context, the worst element and the number of violations."""
    actual = np.asarray(actual, np.float64)
    ref = np.asarray(ref, np.float64)
    # Broadcasting would let a wrongly shaped result pass.
    assert actual.shape == ref.shape, f"{context}: shape {actual.shape} != expected {ref.shape}"
    ok = tolerance_ok(actual, ref, dtype)
    if ok.all():
        return
    atol, rtol = TOLERANCES[_tensor_dtype(dtype)]
    allowed = atol + rtol * np.abs(ref)
    excess = np.abs(actual - ref) / allowed
    excess[np.isnan(excess)] = np.inf
    excess[ok] = -1.0
    worst = np.unravel_index(np.argmax(excess), ref.shape)
    raise AssertionError(
        f"{context}: {np.count_nonzero(~ok)} of {ref.size} elements out of tolerance "
        f"({_tensor_dtype(dtype).name}: atol {atol}, rtol {rtol}); worst at index {tuple(int(i) for i in worst)}: "
        f"actual {float(actual[worst])!r}, expected {float(ref[worst])!r}, allowed error {allowed[worst]:.3g}"
    )


# ---------------------------------------------------------------------------
# Random data


@functools.cache
def run_seed() -> int:
    """One seed per test run: KERNEL_TEST_SEED if set, else fresh randomness."""
    configured = os.environ.get("KERNEL_TEST_SEED")
    return int(configured, 0) if configured else secrets.randbits(32)


def rng_for(test_name: str):
    """(Generator, seed) for one test: the run's seed mixed with a stable hash of the test name,
    so each test draws its own data and a failure reproduces with KERNEL_TEST_SEED=<seed>."""
    seed = run_seed()
    return np.random.default_rng([seed, zlib.crc32(test_name.encode())]), seed


def seed_note(seed: int) -> str:
    """The reproduction hint failure messages carry."""
    return f"seed {seed} (reproduce with KERNEL_TEST_SEED={seed})"


def skip_group_norm_for_call(inputs, attrs):
    """skip_group_norm_ref() for a kernel call's bind-keyed inputs and attributes (defaults applied)."""
    return skip_group_norm_ref(
        inputs["X"],
        inputs["gamma"],
        inputs["beta"],
        inputs["skip"],
        inputs.get("bias"),
        attrs["groups"],
        attrs.get("epsilon", 1e-5),
        attrs["activation"],
        attrs.get("channels_last", 1),
        inputs["X"].dtype,
    )
