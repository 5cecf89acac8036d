# SPDX-License-Identifier: Apache-2.0
"""What this machine's WebGPU device offers, and whether every generated op runs right on it.

    python -m generated doctor

Prints the adapter, the backend, the device's features and limits (WebGPU's names), the subgroup
width a probe shader measures (the adapter does not report it), then runs every op once per dtype
on small random data (natural variant selection) against a float64 NumPy reference (written here,
or the package's reference.py for the layer family), so the package needs nothing beyond wgpu and
numpy, and once more in float16 with outputs beyond
float16's range, which must come back as infinities (WGSL leaves such conversions to the
device). Exit status 0 when every check passes, 1 when
one fails or there is no adapter. float16 checks are skipped, and say why, on a device without
shader-f16.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback

import numpy as np

from . import _runtime, reference

# docs/TESTING.md's tolerances: |actual - reference| <= atol + rtol * |reference|.
TOLERANCES = {"float32": (1e-5, 1e-4), "float16": (2e-3, 2e-3)}

PROBE = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(subgroup_size) size: u32, @builtin(local_invocation_index) i: u32) { out[i] = size; }
"""


# ---------------------------------------------------------------------------------------------
# References, in float64, from the ONNX / ONNX Runtime operator definitions


def _per_channel(values, ndim, axis=1):
    shape = [1] * ndim
    shape[axis] = -1
    return np.asarray(values, np.float64).reshape(shape)


def _normalize_rows(rows, epsilon):
    mean = rows.mean(axis=-1, keepdims=True)
    return (rows - mean) / np.sqrt(rows.var(axis=-1, keepdims=True) + epsilon)


def batch_normalization_ref(inputs, attrs):
    x = inputs["x"].astype(np.float64)
    scale, b, mean, var = (_per_channel(inputs[k], x.ndim) for k in ("scale", "b", "inputMean", "inputVar"))
    return {"y": (x - mean) / np.sqrt(var + attrs["epsilon"]) * scale + b}


def group_normalization_ref(inputs, attrs):
    x = inputs["x"].astype(np.float64)
    rows = _normalize_rows(x.reshape(x.shape[0], attrs["num_groups"], -1), attrs["epsilon"])
    return {
        "y": rows.reshape(x.shape) * _per_channel(inputs["scale"], x.ndim)
        + _per_channel(inputs["bias"], x.ndim)
    }


def instance_normalization_ref(inputs, attrs):
    x = inputs["input"].astype(np.float64)
    planes = _normalize_rows(x.reshape(x.shape[0], x.shape[1], -1), attrs["epsilon"]).reshape(x.shape)
    return {"output": planes * _per_channel(inputs["scale"], x.ndim) + _per_channel(inputs["b"], x.ndim)}


def _channels_last_groups(s, inputs, attrs):
    """com.microsoft's group normalization of NHWC `s` (float64): per (batch item, group), times gamma
    plus beta, then SiLU."""
    n, h, w, c = s.shape
    rows = (
        s.reshape(n, h * w, attrs["groups"], c // attrs["groups"])
        .transpose(0, 2, 1, 3)
        .reshape(n, attrs["groups"], -1)
    )
    normalized = (
        _normalize_rows(rows, attrs["epsilon"]).reshape(n, attrs["groups"], h * w, -1).transpose(0, 2, 1, 3)
    )
    y = normalized.reshape(s.shape) * _per_channel(inputs["gamma"], 4, axis=3) + _per_channel(
        inputs["beta"], 4, axis=3
    )
    with np.errstate(over="ignore"):  # exp(-y) of a large negative y is inf, and y / inf is 0
        return y / (1.0 + np.exp(-y))


def skip_group_norm_ref(inputs, attrs):
    """NHWC: S = X + skip + bias rounded to X's dtype; Y = SiLU(group-normalized S * gamma + beta)."""
    x = inputs["X"]
    s = x.astype(np.float64) + inputs["skip"].astype(np.float64) + _per_channel(inputs["bias"], 4, axis=3)
    s = s.astype(x.dtype).astype(np.float64)
    return {"Y": _channels_last_groups(s, inputs, attrs), "S": s}


def group_norm_ref(inputs, attrs):
    """com.microsoft GroupNorm, NHWC: Y = SiLU(group-normalized X * gamma + beta)."""
    return {"Y": _channels_last_groups(inputs["X"].astype(np.float64), inputs, attrs)}


def _bn_inputs(rng, dtype):
    x = rng.standard_normal((2, 5, 4, 6)) * 2 + 1
    return {
        "x": x,
        "scale": rng.uniform(-2, 2, 5),
        "b": rng.uniform(-1, 1, 5),
        "inputMean": rng.uniform(-1, 1, 5),
        "inputVar": rng.uniform(0.1, 3, 5),
    }


def _gn_inputs(rng, dtype):
    return {
        "x": rng.standard_normal((2, 6, 7, 9)) * 2 + 1,
        "scale": rng.uniform(-2, 2, 6),
        "bias": rng.uniform(-1, 1, 6),
    }


def _in_inputs(rng, dtype):
    return {
        "input": rng.standard_normal((2, 3, 8, 12)) * 2 + 1,
        "scale": rng.uniform(-2, 2, 3),
        "b": rng.uniform(-1, 1, 3),
    }


def _sgn_inputs(rng, dtype):
    shape = (2, 5, 6, 24)
    return {
        "X": rng.standard_normal(shape) * 2 + 1,
        "gamma": rng.uniform(-2, 2, 24),
        "beta": rng.uniform(-1, 1, 24),
        "skip": rng.standard_normal(shape) * 0.5,
        "bias": rng.uniform(-1, 1, 24),
    }


def _layer_inputs(rng, dtype):
    return {
        "x": rng.standard_normal((2, 7, 96)) * 2 + 1,
        "scale": rng.uniform(-2, 2, 96),
        "b": rng.uniform(-1, 1, 96),
    }


def _rms_inputs(rng, dtype):
    return {"x": rng.standard_normal((2, 7, 96)) * 2 + 1, "scale": rng.uniform(-2, 2, 96)}


def _skip_layer_inputs(rng, dtype, beta=True):
    inputs = {
        "input": rng.standard_normal((2, 7, 96)) * 2 + 1,
        "skip": rng.standard_normal((7, 96)) * 0.5,
        "gamma": rng.uniform(-2, 2, 96),
        "beta": rng.uniform(-1, 1, 96),
        "bias": rng.uniform(-1, 1, 96),
    }
    if not beta:
        del inputs["beta"]
    return inputs


def _by_position(domain, op_type, package_name):
    """A CHECKS reference from reference.node_outputs: the package's inputs and outputs by position."""

    def by_position(inputs, attrs):
        package = importlib.import_module(f".{package_name}", __package__)
        values = reference.node_outputs(domain, op_type, [inputs.get(t.key) for t in package.INPUTS], attrs)
        return {t.key: value for t, value in zip(package.OUTPUTS, values) if value is not None}

    return by_position


def _mgn_inputs(rng, dtype):
    return {
        "X": rng.standard_normal((2, 5, 6, 24)) * 2 + 1,
        "gamma": rng.uniform(-2, 2, 24),
        "beta": rng.uniform(-1, 1, 24),
    }


# op package -> (inputs, attrs, outputs to request, reference)
CHECKS = {
    "batch_normalization": (_bn_inputs, {"epsilon": 1e-5}, None, batch_normalization_ref),
    "group_normalization": (_gn_inputs, {"num_groups": 3, "epsilon": 1e-5}, None, group_normalization_ref),
    "instance_normalization": (_in_inputs, {"epsilon": 1e-5}, None, instance_normalization_ref),
    "skip_group_norm": (
        _sgn_inputs,
        {"groups": 4, "activation": 1, "channels_last": 1, "epsilon": 1e-5},
        ("Y", "S"),
        skip_group_norm_ref,
    ),
    "layer_normalization": (
        _layer_inputs,
        {"axis": -1, "epsilon": 1e-5},
        ("y", "mean", "invStdDev"),
        _by_position("ai.onnx", "LayerNormalization", "layer_normalization"),
    ),
    "rms_normalization": (
        _rms_inputs,
        {"epsilon": 1e-5},
        None,
        _by_position("ai.onnx", "RMSNormalization", "rms_normalization"),
    ),
    "simplified_layer_normalization": (
        _rms_inputs,
        {"epsilon": 1e-5},
        ("y", "inv_std_var"),
        _by_position("ai.onnx", "SimplifiedLayerNormalization", "simplified_layer_normalization"),
    ),
    "skip_layer_normalization": (
        _skip_layer_inputs,
        {"epsilon": 1e-5},
        ("output", "mean", "inv_std_var", "input_skip_bias_sum"),
        _by_position("com.microsoft", "SkipLayerNormalization", "skip_layer_normalization"),
    ),
    "skip_simplified_layer_normalization": (
        lambda rng, dtype: _skip_layer_inputs(rng, dtype, beta=False),
        {"epsilon": 1e-5},
        ("output", "inv_std_var", "input_skip_bias_sum"),
        _by_position(
            "com.microsoft", "SkipSimplifiedLayerNormalization", "skip_simplified_layer_normalization"
        ),
    ),
    "group_norm": (
        _mgn_inputs,
        {"groups": 4, "activation": 1, "channels_last": 1, "epsilon": 1e-5},
        None,
        group_norm_ref,
    ),
}
# The input each op's outputs scale with (its gamma), for the float16 overflow check.
SCALES = {
    "batch_normalization": "scale",
    "group_normalization": "scale",
    "instance_normalization": "scale",
    "skip_group_norm": "gamma",
    "layer_normalization": "scale",
    "rms_normalization": "scale",
    "simplified_layer_normalization": "scale",
    "skip_layer_normalization": "gamma",
    "skip_simplified_layer_normalization": "gamma",
    "group_norm": "gamma",
}
# The overflow check's gamma: check_op's times this (at most 60000, which float16 holds).
OVERFLOW_GAMMA = 30000.0
# Outputs whose exact value is this far beyond float16's largest (65504) must come back as infinity
# (float16 rounding gives it from 65520 on); WGSL leaves float16 conversions of values out of range
# to the device, so doctor asks it. Outputs up to IN_RANGE are held to the usual tolerance.
F16_OVERFLOW = 65536.0
IN_RANGE = 65000.0
NO_ADAPTER_HINT = (
    "on a GPU-less Linux machine install Mesa's Vulkan driver (mesa-vulkan-drivers) and set "
    "WGPU_BACKEND_TYPE=Vulkan"
)


# ---------------------------------------------------------------------------------------------
# The device


def op_packages():
    """{name: module} of every op package beside this module (not the private _runtime), in name order."""
    package = importlib.import_module(__package__)
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(package.__path__)
        if info.ispkg and not info.name.startswith("_")
    )
    return {name: importlib.import_module(f".{name}", __package__) for name in names}


def measured_subgroup_width(device):
    """The subgroup_size builtin in a 64-wide workgroup: one width, several, or None without subgroups."""
    import wgpu

    if "subgroup" not in device.features:
        return None
    module = device.create_shader_module(code=PROBE)
    pipeline = device.create_compute_pipeline(
        layout="auto", compute={"module": module, "entry_point": "main"}
    )
    buffer = device.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buffer}}]
    )
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(1)
    compute.end()
    device.queue.submit([encoder.finish()])
    widths = sorted(set(np.frombuffer(device.queue.read_buffer(buffer), np.uint32).tolist()))
    buffer.destroy()
    return widths


def describe_device(device, out):
    """Adapter, backend, features, limits and the measured subgroup width, in plain words."""
    import wgpu

    info = device.adapter_info
    caps = _runtime.device_caps(device)
    print(
        f"adapter:  {info.get('device') or '(unnamed)'} ({info.get('adapter_type', 'unknown type')}; "
        f"{info.get('description') or 'no driver description'})",
        file=out,
    )
    print(f"backend:  {info.get('backend_type', 'unknown')}  (wgpu {wgpu.__version__})", file=out)
    print(
        f"features: {', '.join(sorted(caps.features)) or 'none'}  (enabled on the kernels' device)", file=out
    )
    print("limits:", file=out)
    for name, value in sorted(caps.limits.items()):
        print(f"  {name:<44} {value}", file=out)
    widths = measured_subgroup_width(device)
    if widths is None:
        print("subgroup width: none (the device has no subgroups)", file=out)
    elif len(widths) == 1:
        print(f"subgroup width: {widths[0]} (measured by a probe shader)", file=out)
    else:
        print(f"subgroup width: varies, {', '.join(map(str, widths))} (measured by a probe shader)", file=out)
    return caps


# ---------------------------------------------------------------------------------------------
# The checks


def _largest_excess(actual, ref, dtype):
    """max |actual - ref| / (atol + rtol |ref|): at most 1 passes; NaN counts as infinitely far."""
    atol, rtol = TOLERANCES[dtype]
    error = np.abs(np.asarray(actual, np.float64) - ref) / (atol + rtol * np.abs(ref))
    return float(np.nan_to_num(error, nan=np.inf).max()) if error.size else 0.0


def _check_inputs(name, dtype, seed, gamma_times=1.0):
    """A check's inputs in `dtype`, drawn with `seed`, its gamma (SCALES) `gamma_times` larger."""
    raw = CHECKS[name][0](np.random.default_rng(seed), dtype)
    raw[SCALES[name]] = raw[SCALES[name]] * gamma_times
    return {k: v.astype(dtype) for k, v in raw.items()}


def _call(name, package, dtype, inputs, device):
    """(the variant the request takes, the kernel's outputs) for a check's request."""
    _, attrs, outputs, _ = CHECKS[name]
    shapes = {k: v.shape for k, v in inputs.items()}
    # Every type variable the caller gives (float32 statistics, U, need none).
    dtypes = {t: dtype for t, allowed in package.TYPE_CONSTRAINTS.items() if len(allowed) > 1}
    plan = package.plan(shapes, dtypes, attrs=attrs, device=device, outputs=outputs)
    return plan.variant, package.kernel(inputs, attrs=attrs, outputs=outputs, device=device)


def check_op(name, package, dtype, device):
    """(passed, one line in plain words) for one op and dtype."""
    _, attrs, _, reference = CHECKS[name]
    inputs = _check_inputs(name, dtype, 20251201)
    try:
        variant, actual = _call(name, package, dtype, inputs, device)
    except Exception as error:
        return False, f"{name} {dtype}: the call failed: {type(error).__name__}: {error}"
    expected = reference(inputs, attrs)
    worst = max(_largest_excess(actual[key], expected[key], dtype) for key in actual)
    what = f"{name} {dtype} {tuple(inputs[next(iter(inputs))].shape)}, variant {variant}"
    if worst <= 1.0:
        return True, f"{what}: right (largest error {100 * worst:.0f}% of the allowed)"
    return False, f"{what}: WRONG (largest error {worst:.3g} times the allowed)"


def check_overflow(name, package, device):
    """(passed, one line) for float16 outputs beyond float16's range: check_op's kind of data (its own
    seed) with gamma OVERFLOW_GAMMA times larger, so that many outputs overflow. Those must be
    infinities of the right sign, the others as right as usual."""
    _, attrs, _, reference = CHECKS[name]
    inputs = _check_inputs(name, "float16", 20251202, gamma_times=OVERFLOW_GAMMA)
    try:
        variant, actual = _call(name, package, "float16", inputs, device)
    except Exception as error:
        return False, f"{name} float16 overflow: the call failed: {type(error).__name__}: {error}"
    key = package.OUTPUTS[0].key
    expected, got = reference(inputs, attrs)[key], np.asarray(actual[key], np.float64)
    beyond = np.abs(expected) >= F16_OVERFLOW
    infinite = np.isinf(got[beyond]) & (np.sign(got[beyond]) == np.sign(expected[beyond]))
    what = f"{name} float16 overflow, variant {variant} ({np.count_nonzero(beyond)} of {expected.size} outputs beyond the range)"
    if not beyond.any():
        return False, f"{what}: the check's data did not overflow (a doctor bug)"
    if not infinite.all():
        wrong = got[beyond][~infinite][:3]
        return (
            False,
            f"{what}: WRONG, {np.count_nonzero(~infinite)} came back as {wrong} instead of infinities",
        )
    inside = np.abs(expected) <= IN_RANGE
    worst = _largest_excess(got[inside], expected[inside], "float16")
    if worst > 1.0:
        return False, f"{what}: WRONG, the outputs in range are off by {worst:.3g} times the allowed"
    return (
        True,
        f"{what}: right (infinities of the right sign; the rest within {100 * worst:.0f}% of the allowed)",
    )


def run_checks(device, caps, out):
    """Every op package in float32 and float16; returns the number of failed checks."""
    failed = total = 0
    for name, package in op_packages().items():
        for dtype in ("float32", "float16"):
            if name not in CHECKS:
                print(f"  skip  {name}: doctor has no reference for this op", file=out)
                break
            if dtype == "float16" and "shader-f16" not in caps.features:
                print(f"  skip  {name} float16: the device has no shader-f16", file=out)
                continue
            results = [check_op(name, package, dtype, device)]
            if dtype == "float16":
                results.append(check_overflow(name, package, device))
            for passed, line in results:
                total += 1
                failed += not passed
                print(f"  {'ok  ' if passed else 'FAIL'}  {line}", file=out)
    summary = f"all {total} checks passed" if not failed else f"{failed} of {total} checks FAILED"
    print(summary, file=out)
    return failed


def no_adapter_message(error):
    """What to say when the runtime's default_device() fails, and how to get an adapter: for its
    NoAdapterError, wgpu's reason (`error.reason`); for wgpu's raw RuntimeError ("Request adapter
    failed (3): ... Caused by: ..."), its last line; for another error that says "no WebGPU
    adapter" (a ContractError, say), that sentence on."""
    reason = getattr(error, "reason", None)
    if not reason:
        text = getattr(error, "message", None) or str(error)
        reason = ([line.strip() for line in text.splitlines() if line.strip()] or [type(error).__name__])[-1]
        if "no webgpu adapter" in reason.lower():
            said = reason[reason.lower().index("no webgpu adapter") :]
            return said if "WGPU_BACKEND_TYPE" in said else f"{said}\n{NO_ADAPTER_HINT}"
    return f"no WebGPU adapter: {reason}\n{NO_ADAPTER_HINT}"


def open_device(out):
    """The runtime's default device, or None once `out` says why there is none (no wgpu, no adapter):
    what doctor, bench and check_model do before any GPU work."""
    try:
        importlib.import_module("wgpu")
    except ImportError as error:
        print(f"wgpu is not installed ({error}): pip install wgpu", file=out)
        return None
    try:
        return _runtime.default_device()
    except Exception as error:
        if isinstance(error, _runtime.NoAdapterError) or "adapter" in str(error).lower():
            print(no_adapter_message(error), file=out)
        else:  # an adapter, but no device: request_device_sync failed
            print(f"no WebGPU device: {type(error).__name__}: {' '.join(str(error).split())}", file=out)
        return None


def main(argv=None, out=None):
    """`python -m generated doctor`: 0 when every check passes, 1 on a failure or without an adapter."""
    out = out or sys.stdout
    if argv:
        print("usage: python -m generated doctor (no options)", file=sys.stderr)
        return 2
    device = open_device(out)
    if device is None:
        return 1
    try:
        caps = describe_device(device, out)
    except Exception:
        print(f"describing the device failed:\n{traceback.format_exc()}", file=out)
        return 1
    print("checks (small random data, every op and dtype, against a float64 NumPy reference):", file=out)
    return 1 if run_checks(device, caps, out) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
