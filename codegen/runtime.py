"""Run-time support for the generated kernel package.

This file is copied verbatim into ``generated/_runtime.py``; edit it here, never there.
It imports only the standard library, numpy and (lazily, inside the functions that touch a
GPU) wgpu, so that importing a generated op and making plans stays cheap and GPU-free.
"""

from __future__ import annotations

import math
import numbers
import struct
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

# ---------------------------------------------------------------------------------------------
# Errors


class ContractError(ValueError):
    """A call that breaks a rule of the op's contract; raised before any GPU work."""

    def __init__(self, op, subject, rule, message):
        super().__init__(op, subject, rule, message)
        self.op = op
        self.subject = subject
        self.rule = rule
        self.message = message

    def __str__(self):
        text = f"{self.op}: {self.subject}: {self.message}"
        return text if self.rule in self.message else f"{text} (rule: {self.rule})"


class PlanError(ContractError):
    """A plan-time value that cannot be used: not a whole number, or over a device limit."""


class DimensionError(IndexError):
    """A dimension index outside a shape's rank."""


# ---------------------------------------------------------------------------------------------
# Device capabilities

# Every WebGPU limit with the default the spec guarantees on every device.
WEBGPU_DEFAULT_LIMITS = {
    "maxTextureDimension1D": 8192,
    "maxTextureDimension2D": 8192,
    "maxTextureDimension3D": 2048,
    "maxTextureArrayLayers": 256,
    "maxBindGroups": 4,
    "maxBindGroupsPlusVertexBuffers": 24,
    "maxBindingsPerBindGroup": 1000,
    "maxDynamicUniformBuffersPerPipelineLayout": 8,
    "maxDynamicStorageBuffersPerPipelineLayout": 4,
    "maxSampledTexturesPerShaderStage": 16,
    "maxSamplersPerShaderStage": 16,
    "maxStorageBuffersPerShaderStage": 8,
    "maxStorageTexturesPerShaderStage": 4,
    "maxUniformBuffersPerShaderStage": 12,
    "maxUniformBufferBindingSize": 65536,
    "maxStorageBufferBindingSize": 134217728,
    "minUniformBufferOffsetAlignment": 256,
    "minStorageBufferOffsetAlignment": 256,
    "maxVertexBuffers": 8,
    "maxBufferSize": 268435456,
    "maxVertexAttributes": 16,
    "maxVertexBufferArrayStride": 2048,
    "maxInterStageShaderVariables": 16,
    "maxColorAttachments": 8,
    "maxColorAttachmentBytesPerSample": 32,
    "maxComputeWorkgroupStorageSize": 16384,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupSizeX": 256,
    "maxComputeWorkgroupSizeY": 256,
    "maxComputeWorkgroupSizeZ": 64,
    "maxComputeWorkgroupsPerDimension": 65535,
}

# wgpu-py spells limits in kebab case and splits "1D" as "-1d": compare names with the dashes
# removed and the case folded.
_LIMIT_BY_FOLDED_NAME = {name.lower(): name for name in WEBGPU_DEFAULT_LIMITS}

# wgpu-native feature names that differ from WebGPU's. wgpu-native accepts a request for
# "subgroups" but enables nothing, so the native name must be used on the device and the
# WebGPU name everywhere else.
_WEBGPU_FEATURE_NAMES = {"subgroup": "subgroups"}
_NATIVE_FEATURE_NAMES = {v: k for k, v in _WEBGPU_FEATURE_NAMES.items()}

_DEFAULT_DEVICE_FEATURES = ("shader-f16", "subgroups", "timestamp-query")


@dataclass(frozen=True)
class Caps:
    """What a device offers, in WebGPU's names: all a plan may depend on."""

    limits: Mapping[str, int]
    features: frozenset[str]
    wgsl_language_features: frozenset[str]
    adapter_info: Mapping[str, object]

    @classmethod
    def from_mapping(cls, m):
        """Caps from ``{"limits", "features", "wgslLanguageFeatures", "adapterInfo"}``.

        Every key is optional; a limit left out takes WebGPU's default value, so a plan can be
        made for a device one does not have.
        """
        unknown_keys = sorted(set(m) - {"limits", "features", "wgslLanguageFeatures", "adapterInfo"})
        if unknown_keys:
            raise ValueError(f"unknown caps keys: {', '.join(unknown_keys)}")
        given = dict(m.get("limits", {}))
        unknown = sorted(set(given) - set(WEBGPU_DEFAULT_LIMITS))
        if unknown:
            raise ValueError(f"unknown WebGPU limits: {', '.join(unknown)}")
        limits = dict(WEBGPU_DEFAULT_LIMITS)
        limits.update({name: whole(value, f"limits.{name}") for name, value in given.items()})
        return cls(
            limits=limits,
            features=frozenset(m.get("features", ())),
            wgsl_language_features=frozenset(m.get("wgslLanguageFeatures", ())),
            adapter_info=dict(m.get("adapterInfo", {})),
        )


_caps_by_device = weakref.WeakKeyDictionary()


def device_caps(device):
    """Snapshot of a wgpu device's capabilities, in WebGPU's names (cached per device)."""
    cached = _caps_by_device.get(device)
    if cached is not None:
        return cached
    limits = dict(WEBGPU_DEFAULT_LIMITS)
    for native_name, value in device.limits.items():
        name = _LIMIT_BY_FOLDED_NAME.get(native_name.replace("-", "").lower())
        # Native-only limits are dropped so that a snapshot round-trips through from_mapping;
        # wgpu-native reports 0 for limits it does not track (maxBindGroupsPlusVertexBuffers),
        # where the spec's default is what every device guarantees.
        if name is not None and value:
            limits[name] = int(value)
    info = device.adapter_info
    caps = Caps(
        limits=limits,
        features=frozenset(_WEBGPU_FEATURE_NAMES.get(f, f) for f in device.features),
        # wgpu reports no WGSL language features, and the native query aborts the process.
        wgsl_language_features=frozenset(),
        # No subgroup sizes: wgpu 0.32 reports "stackgroup_min_size/max_size" fields that are not
        # the subgroup size in use (lavapipe reports 4..128 and runs 8 wide); shaders must be
        # right for any subgroup size anyway.
        adapter_info={
            key: info[key]
            for key in ("vendor", "architecture", "device", "description")
            if isinstance(info.get(key), str)
        },
    )
    _caps_by_device[device] = caps
    return caps


def caps_of(caps, device=None):
    """The Caps a plan uses: the device's snapshot (None), a Caps, or a mapping of the facts."""
    if caps is None:
        return device_caps(device if device is not None else default_device())
    if isinstance(caps, Caps):
        return caps
    if isinstance(caps, Mapping):
        return Caps.from_mapping(caps)
    raise TypeError(f"caps must be None, a Caps or a mapping, not {type(caps).__name__}")


# ---------------------------------------------------------------------------------------------
# Requests and plans


@dataclass(frozen=True)
class Request:
    """Everything that selection and planning may read about one call."""

    shapes: Mapping[str, tuple]
    dtypes: Mapping[str, str]
    attrs: Mapping[str, object]
    tunables: Mapping[str, object]
    caps: Caps
    outputs: frozenset = frozenset()  # requested outputs, by bind key and by ONNX role


@dataclass(frozen=True)
class Binding:
    index: int
    name: str
    kind: str  # "input" | "output" | "intermediate" | "uniform"
    resource: str  # bind key, intermediate id, or "params"
    buffer: str  # "read-only-storage" | "storage" | "uniform"


@dataclass(frozen=True)
class PassPlan:
    name: str
    label: str
    template: str
    spec: tuple
    wgsl: str = field(repr=False)
    dispatch: tuple
    uniforms: Mapping[str, object]
    uniform_types: tuple
    overrides: Mapping[str, object]
    override_types: Mapping[str, str]
    bindings: tuple
    workgroup_size: int
    workgroup_storage_bytes: int
    uses_subgroups: bool


@dataclass(frozen=True)
class Plan:
    op: str
    variant: str
    passes: tuple
    inputs: Mapping[str, tuple]
    outputs: Mapping[str, tuple]
    intermediates: Mapping[str, tuple]
    explanation: tuple


# ---------------------------------------------------------------------------------------------
# Expression helpers with JavaScript number semantics (manifest expressions are JS Jinja)


def js_div(a, b):
    """``a / b`` as JavaScript computes it: true division, and no error for a zero divisor."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def js_mod(a, b):
    """``a % b`` as JavaScript computes it: the result takes the dividend's sign."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return math.nan
        r = abs(a) % abs(b)
        return r if a >= 0 else -r
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    return math.fmod(a, b)


def js_str(v):
    """``String(v)`` as JavaScript writes it (Number::toString for numbers)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if not isinstance(v, numbers.Real):
        raise TypeError(f"no JavaScript string form for {type(v).__name__}")
    x = float(v)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    if x < 0:
        return "-" + js_str(-x)
    # repr gives the shortest round-trip digits, as JS does; only the layout differs.
    mantissa, _, exponent = repr(x).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    n = len(int_part) + int(exponent or 0)  # x == 0.digits * 10**n
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    e = n - 1
    sign = "+" if e >= 0 else "-"
    head = digits[0] if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(e)}"


def pow2ceil(x):
    """The smallest power of two >= x (1 for x <= 1)."""
    if x <= 1:
        return 1
    return 1 << (math.ceil(x) - 1).bit_length()


def ceil_div(a, b):
    """``ceil(a / b)`` as an int; exact for ints of any size."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return math.ceil(a / b)


def numel(shape):
    return math.prod(shape)


def _axis(shape, i):
    """i counted from the end when negative; a value still negative is out of range."""
    j = i + len(shape) if i < 0 else i
    if j < 0:
        raise DimensionError(f"dimension {i} does not exist in a rank-{len(shape)} shape {tuple(shape)}")
    return j


def dim(shape, i):
    """``shape[i]``; negative i counts from the end."""
    j = _axis(shape, i)
    if j >= len(shape):
        raise DimensionError(f"dimension {i} does not exist in a rank-{len(shape)} shape {tuple(shape)}")
    return shape[j]


def inner(shape, i):
    """Product of the dims after i (1 past the last dim, like JS ``slice``)."""
    return math.prod(shape[_axis(shape, i) + 1 :])


def outer(shape, i):
    """Product of the dims before i."""
    return math.prod(shape[: _axis(shape, i)])


_ONNX_DTYPE_CODES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "string": 8,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
    "complex64": 14,
    "complex128": 15,
    "bfloat16": 16,
}


def onnx_dtype_code(name):
    """The ONNX TensorProto.DataType code of a numpy-style dtype name."""
    try:
        return _ONNX_DTYPE_CODES[name]
    except KeyError:
        raise ValueError(f"unknown ONNX dtype name {name!r}") from None


def show(thunk):
    """repr of a value for an error message, or why it does not exist for this request."""
    try:
        return repr(thunk())
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as error:
        return f"<undefined: {type(error).__name__}>"


def whole(value, what):
    """value as an int if it is a finite whole number; bools and fractions are refused."""
    if type(value) is int:  # the common case, without the slower numbers-ABC checks
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        x = float(value)
        if math.isfinite(x) and x.is_integer():
            return int(x)
    raise PlanError("plan", what, "whole number", f"expected a whole number, got {value!r}")


def u32(value, what):
    """value as an int if it is a whole number that fits a WGSL u32."""
    v = whole(value, what)
    if not 0 <= v < 2**32:
        raise PlanError("plan", what, "u32 range", f"expected 0 <= value < 2**32, got {v}")
    return v


def _i32(value, what):
    v = whole(value, what)
    if not -(2**31) <= v < 2**31:
        raise PlanError("plan", what, "i32 range", f"expected -2**31 <= value < 2**31, got {v}")
    return v


# ---------------------------------------------------------------------------------------------
# Dispatch and limit checks


def fold_width(caps):
    """The value of DISPATCH_FOLD_WIDTH: shaders rebuild a flat workgroup index from it."""
    # Capped at 65535 so that a plan is the same on every device that reports a larger limit.
    return min(caps.limits["maxComputeWorkgroupsPerDimension"], 65535)


def fold_dispatch(x, y, z, caps, what):
    """Workgroup counts with an x over the fold width folded into y, checked against the device."""
    x, y, z = (whole(v, f"{what} dispatch {axis}") for v, axis in zip((x, y, z), "xyz"))
    if 0 in (x, y, z):
        return (0, 0, 0)
    fold = fold_width(caps)
    if x > fold and y == 1:
        x, y = fold, ceil_div(x, fold)
    limit = caps.limits["maxComputeWorkgroupsPerDimension"]
    for axis, v in zip("xyz", (x, y, z)):
        if not 0 < v <= limit:
            raise PlanError(
                "plan",
                what,
                "maxComputeWorkgroupsPerDimension",
                f"dispatch {axis} = {v} workgroups is outside 1..{limit} (maxComputeWorkgroupsPerDimension)",
            )
    return (x, y, z)


def threads_dispatch(threads, workgroup_size, caps, what):
    """Workgroups for one thread per item, folded like fold_dispatch."""
    return fold_dispatch(ceil_div(whole(threads, what), whole(workgroup_size, what)), 1, 1, caps, what)


def check_pass_limits(op, pass_plan, caps):
    """Refuse a pass the device cannot run.

    wgpu checks workgroup size and workgroup memory only when they are literals; ours come from
    override constants, which reach the driver unchecked.
    """
    subject = f"pass {pass_plan.name}"
    limits = caps.limits
    size = pass_plan.workgroup_size
    if size < 1:
        raise PlanError(op, subject, "workgroup size", f"workgroup size {size} is not positive")
    for name in ("maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX"):
        if size > limits[name]:
            raise PlanError(op, subject, name, f"workgroup size {size} exceeds {name} = {limits[name]}")
    storage = pass_plan.workgroup_storage_bytes
    if storage > limits["maxComputeWorkgroupStorageSize"]:
        raise PlanError(
            op,
            subject,
            "maxComputeWorkgroupStorageSize",
            f"{storage} bytes of workgroup memory exceed maxComputeWorkgroupStorageSize = "
            f"{limits['maxComputeWorkgroupStorageSize']}",
        )
    # A plan made with other caps may have dispatch sizes this device refuses.
    per_dimension = limits["maxComputeWorkgroupsPerDimension"]
    if any(v > per_dimension for v in pass_plan.dispatch):
        raise PlanError(
            op,
            subject,
            "maxComputeWorkgroupsPerDimension",
            f"dispatch {tuple(pass_plan.dispatch)} exceeds maxComputeWorkgroupsPerDimension = {per_dimension}",
        )
    if pass_plan.uses_subgroups and "subgroups" not in caps.features:
        raise PlanError(op, subject, "subgroups", "the pass uses subgroups and the device lacks the feature")


def _storage_nbytes(shape, dtype_name):
    """Bytes of a tensor's buffer: copies and reads need multiples of 4, and never 0."""
    nbytes = numel(shape) * np.dtype(dtype_name).itemsize
    return max(4, -(-nbytes // 4) * 4)


def check_binding_sizes(op, plan, caps):
    """Refuse tensors whose buffers exceed the device's buffer or storage-binding size."""
    for group in (plan.inputs, plan.outputs, plan.intermediates):
        for key, (shape, dtype_name) in group.items():
            nbytes = _storage_nbytes(shape, dtype_name)
            for name in ("maxStorageBufferBindingSize", "maxBufferSize"):
                if nbytes > caps.limits[name]:
                    raise ContractError(
                        op,
                        key,
                        name,
                        f"{tuple(shape)} {dtype_name} needs {nbytes} bytes, over {name} = {caps.limits[name]}",
                    )


# ---------------------------------------------------------------------------------------------
# Variant selection

_REJECTING_ERRORS = (ArithmeticError, IndexError, ValueError, TypeError, KeyError)


def select(op, candidates, request, derived, variant=None):
    """Pick a variant (DESIGN §4); returns (module, explanation lines).

    candidates come in descending priority, ties in manifest order. A candidate needs its
    features and every when clause; a demoted one goes behind every one that is not demoted.
    """
    known = [c.ID for c in candidates]
    if variant is not None and variant not in known:
        raise ContractError(op, "variant", "known variant", f"unknown variant {variant!r}; known: {', '.join(known)}")

    reasons = {}  # ID -> why it was rejected; absent when it passes
    demoted = {}
    notes = {}
    for c in candidates:
        missing = [f for f in c.REQUIRED_FEATURES if f not in request.caps.features]
        if missing:
            reasons[c.ID] = f"needs device feature {', '.join(missing)}"
            continue
        try:
            failed = c.when(request, derived)
        except _REJECTING_ERRORS as e:
            # A rule that cannot be evaluated for these inputs does not hold.
            failed = f"when could not be evaluated: {type(e).__name__}: {e}"
        if failed is not None:
            reasons[c.ID] = failed
            continue
        try:
            demoted[c.ID] = bool(c.demoted(request, derived))
        except _REJECTING_ERRORS as e:
            # Like a when clause, demoteWhen holds only if it evaluates to true.
            demoted[c.ID] = False
            notes[c.ID] = f" (demoteWhen could not be evaluated: {type(e).__name__}: {e})"

    order = sorted(candidates, key=lambda c: demoted.get(c.ID, False))  # stable
    passing = [c for c in order if c.ID not in reasons]

    if variant is not None:
        if variant in reasons:
            raise ContractError(
                op, "variant", "variant applies", f"variant {variant!r} does not apply: {reasons[variant]}"
            )
        chosen = next(c for c in candidates if c.ID == variant)
    elif passing:
        chosen = passing[0]
    else:
        facts = (
            f"shapes {dict(request.shapes)}, dtypes {dict(request.dtypes)}, attrs {dict(request.attrs)}, "
            f"features [{', '.join(sorted(request.caps.features))}]"
        )
        lines = "".join(f"\n  {c.ID}: {reasons[c.ID]}" for c in candidates)
        raise ContractError(op, "variant", "no candidate", f"no variant applies to {facts}:{lines}\n")

    how = "was forced with variant=" if variant is not None else "was preferred"
    explanation = []
    for c in order:
        head = f"{c.ID} (priority {c.PRIORITY}): "
        if c.ID in reasons:
            line = f"rejected: {reasons[c.ID]}"
        elif c is chosen:
            line = "taken"
            if variant is not None:
                line += " (forced with variant=)"
            elif demoted[c.ID]:
                line += " (demoted, but no candidate that is not demoted passes)"
        elif demoted[c.ID]:
            line = f"demoted: passes, but its demoteWhen holds; {chosen.ID} {how}"
        else:
            line = f"passes, but {chosen.ID} {how}"
        explanation.append(head + line + notes.get(c.ID, ""))
    return chosen, tuple(explanation)


# ---------------------------------------------------------------------------------------------
# GPU side

_default_device = None
_default_device_lock = threading.Lock()


def default_device():
    """One shared wgpu device per process, with the adapter's limits and useful features."""
    global _default_device
    with _default_device_lock:
        if _default_device is None:
            import wgpu

            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            if adapter is None:
                raise RuntimeError(
                    "no WebGPU adapter; on a GPU-less Linux machine install Mesa's Vulkan driver "
                    "and set WGPU_BACKEND_TYPE=Vulkan"
                )
            wanted = (_NATIVE_FEATURE_NAMES.get(f, f) for f in _DEFAULT_DEVICE_FEATURES)
            _default_device = adapter.request_device_sync(
                required_features=[f for f in wanted if f in adapter.features],
                required_limits=adapter.limits,
            )
        return _default_device


def _buffer_usage():
    import wgpu

    return wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


class Tensor:
    """A tensor resident on a GPU: a storage buffer with a shape and a dtype.

    The buffer is padded to a multiple of 4 bytes (an f16 tensor of odd length) and is at least
    4 bytes, so that copies, reads and bindings are valid; the padding is never visible.
    """

    __slots__ = ("buffer", "shape", "dtype", "device")

    def __init__(self, buffer, shape, dtype, device):
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.device = device

    @property
    def nbytes(self):
        return numel(self.shape) * self.dtype.itemsize

    @classmethod
    def empty(cls, shape, dtype, device=None):
        device = device if device is not None else default_device()
        buffer = device.create_buffer(size=_storage_nbytes(shape, np.dtype(dtype).name), usage=_buffer_usage())
        return cls(buffer, shape, dtype, device)

    @classmethod
    def from_numpy(cls, array, device=None):
        array = np.ascontiguousarray(array)
        tensor = cls.empty(array.shape, array.dtype, device)
        data = array.tobytes()
        if len(data) % 4:
            data += bytes(4 - len(data) % 4)
        if data:
            tensor.device.queue.write_buffer(tensor.buffer, 0, data)
        return tensor

    def numpy(self):
        """Read the tensor back (waits for the GPU work that writes it)."""
        data = self.device.queue.read_buffer(self.buffer, 0, self.buffer.size)
        return np.frombuffer(data, self.dtype, count=numel(self.shape)).reshape(self.shape)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name})"


def pack_uniforms(uniform_types, uniforms):
    """The bytes of a WGSL uniform struct of u32/i32/f32 fields; padding fields are zero."""
    formats = {"u32": "I", "i32": "i", "f32": "f"}
    values = []
    for name, typ in uniform_types:
        if name.startswith("_pad") and name not in uniforms:
            values.append(0)
        elif typ == "u32":
            values.append(u32(uniforms[name], f"uniform {name}"))
        elif typ == "i32":
            values.append(_i32(uniforms[name], f"uniform {name}"))
        else:
            values.append(float(uniforms[name]))
    return struct.pack("<" + "".join(formats[typ] for _, typ in uniform_types), *values)


def _override_constants(pass_plan):
    constants = {}
    for name, value in pass_plan.overrides.items():
        typ = pass_plan.override_types.get(name, "f32")
        if typ == "u32":
            constants[name] = u32(value, f"override {name}")
        elif typ == "i32":
            constants[name] = _i32(value, f"override {name}")
        else:
            constants[name] = float(value)
    return constants


# Per-device caches; weak keys so that a caller's device and its pipelines go away together.
_shader_modules = weakref.WeakKeyDictionary()  # device -> {wgsl: module}
_bind_group_layouts = weakref.WeakKeyDictionary()  # device -> {layout key: layout}
_pipelines = weakref.WeakKeyDictionary()  # device -> {(wgsl, overrides, layout key): (pipeline, layout)}


def _layout_key(pass_plan):
    return tuple((b.index, b.buffer) for b in pass_plan.bindings)


def _bind_group_layout(device, key):
    import wgpu

    cache = _bind_group_layouts.setdefault(device, {})
    if key not in cache:
        cache[key] = device.create_bind_group_layout(
            entries=[
                {"binding": index, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": buffer}}
                for index, buffer in key
            ]
        )
    return cache[key]


def _pipeline(device, pass_plan):
    """(pipeline, bind group layout) for a pass, created once per device, WGSL and overrides."""
    constants = _override_constants(pass_plan)
    layout_key = _layout_key(pass_plan)
    key = (pass_plan.wgsl, tuple(sorted(constants.items())), layout_key)
    cache = _pipelines.setdefault(device, {})
    if key not in cache:
        modules = _shader_modules.setdefault(device, {})
        if pass_plan.wgsl not in modules:
            modules[pass_plan.wgsl] = device.create_shader_module(label=pass_plan.label, code=pass_plan.wgsl)
        # An explicit layout from the plan's bindings: layout="auto" drops bindings the shader
        # does not use, and a bind group holding them is then refused.
        bind_group_layout = _bind_group_layout(device, layout_key)
        pipeline = device.create_compute_pipeline(
            label=pass_plan.label,
            layout=device.create_pipeline_layout(bind_group_layouts=[bind_group_layout]),
            compute={"module": modules[pass_plan.wgsl], "entry_point": "main", "constants": constants},
        )
        cache[key] = (pipeline, bind_group_layout)
    return cache[key]


def _checked_tensor(op, key, value, spec, device):
    shape, dtype_name = spec
    if value.shape != tuple(shape) or value.dtype != np.dtype(dtype_name):
        raise ContractError(
            op,
            key,
            "planned shape and dtype",
            f"got {value.shape} {value.dtype}, the plan is for {tuple(shape)} {dtype_name}",
        )
    if isinstance(value, Tensor) and value.device is not device:
        raise ContractError(op, key, "same device", "the tensor lives on another device than the call")
    return value


@dataclass(frozen=True)
class BoundPass:
    """One pass ready to encode: its pipeline, its bind group and its workgroup counts."""

    label: str
    pipeline: object
    bind_group: object
    dispatch: tuple


_UNIFORM_CACHE_SIZE = 1024
_uniform_buffers = weakref.WeakKeyDictionary()  # device -> {packed bytes: buffer}


def _uniform_buffer(device, pass_plan):
    """One read-only uniform buffer per distinct content and device, reused by every call."""
    import wgpu

    data = pack_uniforms(pass_plan.uniform_types, pass_plan.uniforms)
    buffers = _uniform_buffers.setdefault(device, {})
    buffer = buffers.get(data)
    if buffer is None:
        if len(buffers) >= _UNIFORM_CACHE_SIZE:
            buffers.clear()  # dropped, not destroyed: work already submitted keeps them alive
        buffer = buffers[data] = device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.UNIFORM)
    return buffer


def bind_passes(passes, tensors, device):
    """Pipelines and uniform buffers (both cached per device) and bind groups for passes.

    `tensors` maps each binding kind ("input", "output", "intermediate") to {key: Tensor}.
    """
    bound = []
    for pass_plan in passes:
        pipeline, bind_group_layout = _pipeline(device, pass_plan)
        entries = []
        for b in pass_plan.bindings:
            if b.kind == "uniform":
                buffer = _uniform_buffer(device, pass_plan)
            else:
                buffer = tensors[b.kind][b.resource].buffer
            entries.append({"binding": b.index, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}})
        bind_group = device.create_bind_group(layout=bind_group_layout, entries=entries)
        bound.append(BoundPass(pass_plan.label, pipeline, bind_group, tuple(pass_plan.dispatch)))
    return bound


def encode_passes(encoder, bound, timestamps=None, label=None):
    """Encode bound passes into `encoder` as dispatches of one compute pass.

    One compute pass, not one each: WebGPU makes every dispatch its own synchronization scope, so a
    dispatch still sees everything the previous one wrote, but a pass boundary costs far more than
    the barrier between two dispatches (on an NVIDIA H200, about 7.4 µs against 1.7 µs: see
    docs/PERFORMANCE.md). Each dispatch sits in a debug group named after its pass.
    `timestamps` = (query_set, begin_index, end_index) writes a timestamp at the beginning and at
    the end of the compute pass, so that the pair spans the whole plan.
    """
    writes = None
    if timestamps is not None:
        query_set, begin, end = timestamps
        writes = {"query_set": query_set, "beginning_of_pass_write_index": begin, "end_of_pass_write_index": end}
    compute = encoder.begin_compute_pass(label=label, timestamp_writes=writes)
    for item in bound:
        compute.push_debug_group(item.label)
        compute.set_pipeline(item.pipeline)
        compute.set_bind_group(0, item.bind_group)
        compute.dispatch_workgroups(*item.dispatch)
        compute.pop_debug_group()
    compute.end()


def run_plan(plan, inputs, device=None, out=None):
    """Run a plan: upload, allocate, encode every pass, submit once, read back.

    All inputs Tensors -> Tensors out without read-back (they chain on the GPU); otherwise
    numpy arrays out. `out` maps output keys to Tensors to write into instead of fresh ones.
    """
    missing = [key for key in plan.inputs if key not in inputs]
    if missing:
        raise ContractError(plan.op, ", ".join(missing), "required input", "missing from the inputs")
    values = [inputs[key] for key in plan.inputs]
    resident = all(isinstance(v, Tensor) for v in values)
    if device is None:
        device = next((v.device for v in values if isinstance(v, Tensor)), None) or default_device()
    for key in plan.inputs:
        _checked_tensor(plan.op, key, inputs[key], plan.inputs[key], device)

    caps = device_caps(device)
    check_binding_sizes(plan.op, plan, caps)
    for pass_plan in plan.passes:
        check_pass_limits(plan.op, pass_plan, caps)
    runnable = [p for p in plan.passes if 0 not in p.dispatch]

    created = []  # buffers this call owns and releases, unless handed out as results
    try:
        tensors = {"input": {}, "output": {}, "intermediate": {}}
        for key in plan.inputs:
            value = inputs[key]
            if not isinstance(value, Tensor):
                value = Tensor.from_numpy(value, device)
                created.append(value.buffer)
            tensors["input"][key] = value
        out = out or {}
        for key in out:
            if key not in plan.outputs:
                raise ContractError(plan.op, f"out {key}", "known output", f"outputs are {', '.join(plan.outputs)}")
            _checked_tensor(plan.op, f"out {key}", out[key], plan.outputs[key], device)
        for kind, group in (("output", plan.outputs), ("intermediate", plan.intermediates)):
            for key, (shape, dtype_name) in group.items():
                if kind == "output" and key in out:
                    tensors[kind][key] = out[key]
                    continue
                tensors[kind][key] = Tensor.empty(shape, dtype_name, device)
                if kind == "intermediate" or not resident:
                    created.append(tensors[kind][key].buffer)

        if runnable:  # empty tensors: nothing to dispatch
            label = f"{plan.op} {plan.variant}"
            encoder = device.create_command_encoder(label=label)
            encode_passes(encoder, bind_passes(runnable, tensors, device), label=label)
            device.queue.submit([encoder.finish()])

        if resident:
            return dict(tensors["output"])
        return {key: tensor.numpy() for key, tensor in tensors["output"].items()}
    finally:
        # wgpu frees a destroyed buffer only once the submitted work that uses it is done.
        for buffer in created:
            buffer.destroy()


# ---------------------------------------------------------------------------------------------
# The generated op packages: contract data, requests, plans and calls

WGSL_DTYPES = {"float32": "f32", "float16": "f16"}


@dataclass(frozen=True)
class TensorSpec:
    key: str  # bind key: what `kernel()` takes and returns
    role: str  # ONNX name
    type_var: str
    optional: bool


@dataclass(frozen=True)
class AttributeSpec:
    name: str
    kind: str  # "int" | "float"
    default: object  # None: no default
    required: bool
    allowed: tuple | None
    comparison: str | None  # "float32": compare after rounding to float32


@dataclass(frozen=True)
class Shader:
    """One rendered, validated specialization of a pass's template."""

    template: str
    key: tuple  # the specialization values it was rendered with
    bindings: tuple
    uniform_types: tuple
    overrides: tuple  # (name, "u32" | "f32") the shader declares
    workgroup_size: str  # an override name or an integer literal
    workgroup_arrays: tuple  # (bytes per element, factors: override names or integer literals)
    uses_subgroups: bool
    wgsl: str = field(repr=False)


@dataclass(frozen=True)
class OpContract:
    op: str
    inputs: tuple
    outputs: tuple
    type_constraints: Mapping
    attributes: tuple
    tunables: Mapping
    candidates: tuple
    output_shapes: object
    check_contract: object
    derive: object
    check_derived_contract: object


def _override_value(value, kind, what):
    if kind == "f32":
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise PlanError("plan", what, "finite f32", f"expected a finite number, got {value!r}")
        return float(value)
    return u32(value, what) if kind == "u32" else _i32(value, what)


def make_pass(r, shader, name, label, dispatch, uniforms, numbers_):
    """A PassPlan from a pass's computed values; checks every value that reaches the shader."""
    overrides = {n: _override_value(numbers_[n], kind, f"{label}: override {n}") for n, kind in shader.overrides}

    def factor(term):
        return int(term) if term.isdigit() else overrides[term]

    for field_name, kind in shader.uniform_types:
        if field_name in uniforms:
            _override_value(uniforms[field_name], kind, f"{label}: uniform {field_name}")
    storage = sum(size * math.prod(factor(t) for t in terms) for size, terms in shader.workgroup_arrays)
    return PassPlan(
        name=name,
        label=label,
        template=shader.template,
        spec=shader.key,
        wgsl=shader.wgsl,
        dispatch=dispatch,
        uniforms=uniforms,
        uniform_types=shader.uniform_types,
        overrides=overrides,
        override_types=dict(shader.overrides),
        bindings=shader.bindings,
        workgroup_size=factor(shader.workgroup_size),
        workgroup_storage_bytes=storage,
        uses_subgroups=shader.uses_subgroups,
    )


_DTYPE_NAMES = {
    "f32": "float32", "f16": "float16", "float32": "float32", "float16": "float16",
    np.dtype("float32"): "float32", np.dtype("float16"): "float16",
}


def _dtype_name(value):
    """numpy dtypes, ONNX names and WGSL names all mean one of float32 / float16."""
    text = _DTYPE_NAMES.get(value)
    if text is None:
        try:
            text = np.dtype(value).name
        except TypeError:
            text = str(value)
    return text


def _attributes(contract, attrs):
    attrs = dict(attrs or {})
    known = {a.name: a for a in contract.attributes}
    unknown = sorted(set(attrs) - set(known))
    if unknown:
        raise ContractError(contract.op, f"attribute {unknown[0]}", "known attribute", f"unknown attribute; known: {', '.join(known)}")
    resolved = {}
    for name, spec in known.items():
        if name not in attrs:
            if spec.default is None:
                if spec.required:
                    raise ContractError(contract.op, f"attribute {name}", "required", "the attribute is required and has no default")
                continue
            resolved[name] = spec.default
            continue
        value = attrs[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ContractError(contract.op, f"attribute {name}", spec.kind, f"expected a number, got {value!r}")
        if spec.kind == "int":
            if not float(value).is_integer():
                raise ContractError(contract.op, f"attribute {name}", "int", f"expected an integer, got {value!r}")
            value = int(value)
        elif not math.isfinite(value):
            raise ContractError(contract.op, f"attribute {name}", "finite", f"must be a finite number, got {value!r}")
        if spec.allowed is not None:
            same = np.float32 if spec.comparison == "float32" else (lambda v: v)
            if not any(same(value) == same(a) for a in spec.allowed):
                allowed = ", ".join(repr(a) for a in spec.allowed)
                raise ContractError(
                    contract.op, f"attribute {name}", f"one of {allowed}", f"{value!r} is not supported (allowed: {allowed})"
                )
        resolved[name] = value
    return resolved


def _requested_outputs(contract, outputs):
    """Bind keys of the outputs asked for (default: the required ones); unknown names refused."""
    by_name = {t.key: t.key for t in contract.outputs} | {t.role: t.key for t in contract.outputs}
    if outputs is None:
        return tuple(t.key for t in contract.outputs if not t.optional)
    if isinstance(outputs, str):
        outputs = (outputs,)
    unknown = [o for o in outputs if o not in by_name]
    if unknown:
        raise ContractError(contract.op, f"output {unknown[0]}", "known output", f"unknown output; outputs are {', '.join(t.role for t in contract.outputs)}")
    return tuple(dict.fromkeys(by_name[o] for o in outputs))


def _request(contract, shapes, dtypes, attrs, caps, tunables, outputs=None):
    tensors = {t.key: t for t in contract.inputs}
    roles = {t.role: t.key for t in contract.inputs}
    given = {roles.get(k, k): tuple(int(d) for d in v) for k, v in shapes.items()}
    unknown = sorted(set(given) - set(tensors))
    if unknown:
        raise ContractError(contract.op, f"input {unknown[0]}", "known input", f"unknown input; inputs are {', '.join(tensors)}")
    missing = [t.role for t in contract.inputs if not t.optional and t.key not in given]
    if missing:
        raise ContractError(contract.op, f"input {missing[0]}", "required input", "the input is missing")
    for key, shape in given.items():
        if any(d < 0 for d in shape):
            raise ContractError(contract.op, f"input {tensors[key].role}", "shape", f"negative dimension in {shape}")
    wgsl_dtypes = {}
    for type_var, value in (dtypes or {}).items():
        name = _dtype_name(value)
        allowed = contract.type_constraints.get(type_var)
        if allowed is None:
            raise ContractError(contract.op, f"dtype {type_var}", "known type variable", f"unknown type variable; known: {', '.join(contract.type_constraints)}")
        if name not in allowed:
            raise ContractError(contract.op, f"dtype {type_var}", f"one of {', '.join(allowed)}", f"{name} is not supported")
        wgsl_dtypes[type_var] = WGSL_DTYPES[name]
    for type_var in contract.type_constraints:
        if type_var not in wgsl_dtypes:
            raise ContractError(contract.op, f"dtype {type_var}", "given", "pass dtypes={...} for every type variable")
    unknown_tunables = sorted(set(tunables or {}) - set(contract.tunables))
    if unknown_tunables:
        raise ContractError(contract.op, f"tunable {unknown_tunables[0]}", "known tunable", f"known: {', '.join(contract.tunables)}")
    for name, value in (tunables or {}).items():
        # Workgroup sizes, counts and thresholds: some divide, so 0 is refused with the rest.
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and float(value).is_integer() and value >= 1):
            raise ContractError(contract.op, f"tunable {name}", "a whole number >= 1", f"got {value!r}")
    wanted = _requested_outputs(contract, outputs)
    roles = {t.key: t.role for t in contract.outputs}
    requested = frozenset(wanted) | frozenset(roles[k] for k in wanted)
    request = Request(given, wgsl_dtypes, _attributes(contract, attrs), {**contract.tunables, **(tunables or {})}, caps, requested)
    output_shapes = contract.output_shapes(request)
    return Request({**given, **output_shapes}, request.dtypes, request.attrs, request.tunables, caps, requested)


def _plan(contract, request, variant):
    contract.check_contract(request)
    try:
        derived = contract.derive(request)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as error:
        # The contract passed, so this is a request the manifest did not foresee: refuse it clearly.
        raise ContractError(contract.op, "request", "derive", f"the manifest's derived values cannot be computed: {type(error).__name__}: {error}") from None
    contract.check_derived_contract(request, derived)
    chosen, explanation = select(contract.op, contract.candidates, request, derived, variant)
    values = chosen.values(request, derived)
    spec_of = {t.key: t for t in contract.inputs + contract.outputs}

    def described(keys):
        return {k: (request.shapes[k], {"f32": "float32", "f16": "float16"}[request.dtypes[spec_of[k].type_var]]) for k in keys}

    inputs = described(t.key for t in contract.inputs if t.key in request.shapes)
    passes = chosen.passes(request, derived, values)
    # Requested outputs, and any other output the chosen passes write (allocated, not returned).
    bound = {b.resource for p in passes for b in p.bindings if b.kind == "output"}
    outputs = described(t.key for t in contract.outputs if t.key in request.outputs or t.key in bound)
    intermediates = {k: (tuple(whole(d, f"intermediate {k}") for d in shape), dtype) for k, (shape, dtype) in chosen.intermediates(request, derived, values).items()}
    plan = Plan(contract.op, chosen.ID, passes, inputs, outputs, intermediates, explanation)
    check_binding_sizes(contract.op, plan, request.caps)
    for pass_plan in passes:
        check_pass_limits(contract.op, pass_plan, request.caps)
    return plan


_PLAN_CACHE_SIZE = 1024
_plans = {}  # request key -> (caps, plan): plans are immutable, so a repeated request reuses one
_default_caps = []


def _webgpu_default_caps():
    if not _default_caps:
        _default_caps.append(Caps.from_mapping({}))
    return _default_caps[0]


def _cached_plan(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs):
    """_plan() of the request, memoised: a repeated call costs one dictionary lookup."""
    try:
        key = (
            contract.op,
            tuple(sorted((k, tuple(v)) for k, v in shapes.items())),
            tuple(sorted((k, str(v)) for k, v in (dtypes or {}).items())),
            tuple(sorted((attrs or {}).items())),
            tuple(sorted((tunables or {}).items())),
            id(caps),
            variant,
            outputs if outputs is None or isinstance(outputs, str) else tuple(outputs),
        )
        hash(key)
    except TypeError:
        key = None  # unhashable attribute values: plan without the cache (and refuse them there)
    cached = _plans.get(key) if key is not None else None
    if cached is not None and cached[0] is caps:
        return cached[1]
    plan = _plan(contract, _request(contract, shapes, dtypes, attrs, caps, tunables, outputs), variant)
    if key is not None:
        if len(_plans) >= _PLAN_CACHE_SIZE:
            _plans.clear()
        _plans[key] = (caps, plan)
    return plan


def build_plan(contract, shapes, dtypes=None, attrs=None, *, caps=None, tunables=None, variant=None, device=None, outputs=None):
    """plan(): contract checks, derive, selection and every pass's values; no GPU work.

    Without caps= or device=, plans for WebGPU's default limits and no optional features.
    """
    caps = caps_of(caps, device) if (caps is not None or device is not None) else _webgpu_default_caps()
    return _cached_plan(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs)


def explain_plan(contract, shapes, dtypes=None, attrs=None, *, caps=None, tunables=None, device=None, outputs=None):
    plan = build_plan(contract, shapes, dtypes, attrs, caps=caps, tunables=tunables, device=device, outputs=outputs)
    return "\n".join(plan.explanation)


def run_kernel(contract, inputs, attrs=None, *, outputs=None, device=None, variant=None, caps=None, tunables=None, out=None):
    """kernel(): infer shapes and dtypes from the inputs, plan, run; everything checked first."""
    tensors = {t.key: t for t in contract.inputs}
    roles = {t.role: t.key for t in contract.inputs}
    inputs = {roles.get(k, k): v for k, v in inputs.items()}
    dtypes, shapes = {}, {}
    for key, value in inputs.items():
        if key not in tensors:
            raise ContractError(contract.op, f"input {key}", "known input", f"unknown input; inputs are {', '.join(tensors)}")
        if not isinstance(value, Tensor):
            value = np.asarray(value)
            inputs[key] = value
        name = _dtype_name(value.dtype)
        type_var = tensors[key].type_var
        allowed = contract.type_constraints[type_var]
        if name not in allowed:
            raise ContractError(contract.op, f"input {tensors[key].role}", f"{type_var} in {', '.join(allowed)}", f"dtype {name} is not supported")
        if dtypes.setdefault(type_var, name) != name:
            first = next(tensors[k].role for k in shapes if tensors[k].type_var == type_var)
            raise ContractError(
                contract.op, f"input {tensors[key].role}", f"one dtype for {type_var}",
                f"dtype {name} differs from {first}'s {dtypes[type_var]}: every {type_var} tensor must share one dtype",
            )
        shapes[key] = tuple(value.shape)
    if device is None and caps is None:
        device = next((v.device for v in inputs.values() if isinstance(v, Tensor)), None) or default_device()
    elif device is None:
        device = default_device()
    plan = _cached_plan(contract, shapes, dtypes, attrs, caps_of(caps, device), tunables, variant, outputs)
    wanted = _requested_outputs(contract, outputs)
    by_role = {t.role: t.key for t in contract.outputs}
    out = {by_role.get(k, k): v for k, v in (out or {}).items()}
    results = run_plan(plan, inputs, device, out)
    return {o: results[o] for o in wanted}
