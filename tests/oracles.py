"""Reference implementations and helpers that kernel tests compare against.

The float64 references live in the package (`generated/reference.py`, check_model's judge too);
here: their test-facing names, the other implementations (onnxruntime, the ONNX backend node
tests), tolerances and seeds.
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

from generated import reference

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


# ---------------------------------------------------------------------------
# References: the package's float64 definitions (generated/reference.py), written from the ONNX
# and ONNX Runtime operator definitions, independent of the kernels.

batch_normalization_ref = reference.batch_normalization
group_normalization_ref = reference.group_normalization
instance_normalization_ref = reference.instance_normalization
microsoft_group_norm_ref = reference.microsoft_group_norm


def node_reference(package, inputs, attrs) -> dict:
    """{output key: float64 reference} of a call to `package` (its bind keys), through
    generated/reference.py's node_outputs with the inputs and outputs by position (ONNX's order); an
    output the op's definition never writes has no entry."""
    from generated import ops

    entry = next(e for e in ops().values() if e.module is package and e.note == "")
    positional = [inputs.get(spec.key) for spec in package.INPUTS]
    values = reference.node_outputs(entry.domain, entry.op_type, positional, attrs, entry.since_version)
    return {spec.key: value for spec, value in zip(package.OUTPUTS, values) if value is not None}


def skip_group_norm_ref(X, gamma, beta, skip, bias, groups, epsilon, activation, channels_last, t_dtype):
    """reference.skip_group_norm with `t_dtype` also given by its WGSL name (f32, f16)."""
    return reference.skip_group_norm(
        X, gamma, beta, skip, bias, groups, epsilon, activation, channels_last, _tensor_dtype(t_dtype)
    )


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
    model's input/output order. The ``*_expanded`` and ``*_expanded_ver<N>`` cases (the operator's
    function body as a multi-node graph, on the same data) are left out: they
    test the function body, not the operator.
    """
    cases = []
    for case in _node_test_cases():
        if case.name.startswith(prefix) and "_expanded" not in case.name:
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


def microsoft_group_norm_for_call(inputs, attrs):
    """microsoft_group_norm_ref() (com.microsoft GroupNorm) for a kernel call's bind-keyed inputs and
    attributes (defaults applied)."""
    return microsoft_group_norm_ref(
        inputs["X"],
        inputs["gamma"],
        inputs["beta"],
        attrs["groups"],
        attrs.get("epsilon", 1e-5),
        attrs["activation"],
        attrs.get("channels_last", 1),
    )
