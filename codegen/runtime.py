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
from collections import OrderedDict, deque
from collections import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

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


class LRUCache:
    """A bounded, thread-safe mapping that forgets its least recently used entry.

    Every cache of the runtime is one of these, so that an app with changing shapes or
    attribute values keeps a bounded number of plans, pipelines and buffers alive.
    """

    def __init__(self, maxsize):
        self.maxsize = maxsize
        self._data = OrderedDict()
        self._lock = threading.Lock()
        # Entries to forget, queued by weak-reference callbacks (`forget_later`). A callback runs
        # whenever the garbage collector does, possibly inside this cache's own lock in the same
        # thread, so it only queues; get() and put() forget under the lock.
        self._forgotten = deque()

    def _forget_queued(self):
        while self._forgotten:
            key, value = self._forgotten.popleft()
            if self._data.get(key) is value:
                del self._data[key]

    def get(self, key, default=None):
        with self._lock:
            if self._forgotten:
                self._forget_queued()
            try:
                self._data.move_to_end(key)
            except KeyError:
                return default
            return self._data[key]

    def put(self, key, value):
        with self._lock:
            if self._forgotten:
                self._forget_queued()
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self):
        with self._lock:
            self._forget_queued()
            return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def clear(self):
        with self._lock:
            self._data.clear()

    def forget_later(self, key, value):
        """Forget `key` at the next use if it still maps to `value` (not to what replaced it)."""
        self._forgotten.append((key, value))


def _watching(cache, key, value, buffers):
    """Weak references to `buffers` that make `cache` forget `key` once any of them is collected.

    A bind group keeps its buffers' GPU memory alive, so an entry must not outlive the buffers a
    caller let go of: the memory of a dropped Tensor is freed when the Tensor is, not when the
    cache gets round to forgetting it.
    """
    return tuple(weakref.ref(b, lambda _ref: cache.forget_later(key, value)) for b in buffers)


def _per_device(caches, device, maxsize):
    """The LRUCache of one device in a WeakKeyDictionary of them."""
    cache = caches.get(device)
    if cache is None:
        cache = caches.setdefault(device, LRUCache(maxsize))
    return cache


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

# WebGPU's feature names (https://www.w3.org/TR/webgpu/#feature-index): what `caps=` may list.
WEBGPU_FEATURES = frozenset(
    {
        "core-features-and-limits",
        "depth-clip-control",
        "depth32float-stencil8",
        "texture-compression-bc",
        "texture-compression-bc-sliced-3d",
        "texture-compression-etc2",
        "texture-compression-astc",
        "texture-compression-astc-sliced-3d",
        "timestamp-query",
        "indirect-first-instance",
        "shader-f16",
        "rg11b10ufloat-renderable",
        "bgra8unorm-storage",
        "float32-filterable",
        "float32-blendable",
        "clip-distances",
        "dual-source-blending",
        "subgroups",
        "texture-formats-tier1",
        "texture-formats-tier2",
        "primitive-index",
    }
)


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
        made for a device one does not have. Names are WebGPU's; an unknown one is refused,
        since a misspelt feature (``shader_f16``) would otherwise plan silently without it.
        """
        unknown_keys = sorted(set(m) - {"limits", "features", "wgslLanguageFeatures", "adapterInfo"})
        if unknown_keys:
            raise _caps_error("keys", f"unknown caps keys: {', '.join(unknown_keys)}", _CAPS_KEYS)
        given = dict(m.get("limits", {}))
        unknown = sorted(set(given) - set(WEBGPU_DEFAULT_LIMITS))
        if unknown:
            raise _caps_error("limits", f"unknown WebGPU limits: {', '.join(unknown)}", WEBGPU_DEFAULT_LIMITS)
        features = m.get("features", ())
        if isinstance(features, str):
            raise _caps_error("features", f"features must be a list of names, not the string {features!r}", ())
        unknown = sorted(set(features) - WEBGPU_FEATURES)
        if unknown:
            raise _caps_error("features", f"unknown WebGPU features: {', '.join(unknown)}", WEBGPU_FEATURES)
        limits = dict(WEBGPU_DEFAULT_LIMITS)
        for name, value in given.items():
            try:
                limit = whole(value, f"limits.{name}")
            except PlanError as error:
                raise _caps_error("limits", f"limits.{name}: {error.message}", ()) from None
            if limit < 0:
                raise _caps_error("limits", f"limits.{name} = {value!r} is negative", ())
            limits[name] = limit
        return cls(
            limits=limits,
            features=frozenset(features),
            wgsl_language_features=frozenset(m.get("wgslLanguageFeatures", ())),
            adapter_info=dict(m.get("adapterInfo", {})),
        )


_CAPS_KEYS = ("limits", "features", "wgslLanguageFeatures", "adapterInfo")


def _caps_error(what, message, known):
    import difflib

    hint = ""
    names = message.rpartition(": ")[2].split(", ")
    close = [match for name in names for match in difflib.get_close_matches(name, list(known), n=1)]
    if close:
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)"
    return ContractError("caps", what, "WebGPU names", message + hint)


def features_text(features):
    """A feature set as a message shows it."""
    return ", ".join(sorted(features)) or "none"


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
    raise ContractError("caps", "caps", "a mapping", f"caps must be None, a Caps or a mapping of WebGPU facts, not {type(caps).__name__}")


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
    names: Mapping[str, str] = field(default_factory=dict)  # bind key -> the name the caller used


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
    workgroup_size_name: str = ""  # the override that sets the workgroup size ("" for a literal)
    # Computed once when the plan is made, so that a call only looks them up.
    pipeline_constants: tuple = ()  # sorted (override, value) pairs as the pipeline gets them
    uniform_data: bytes = field(default=b"", repr=False)  # the packed Params struct

    @property
    def values(self):
        """Every number the pass's shader gets, whether bound as an override or through Params."""
        return {**self.overrides, **self.uniforms}


@dataclass(frozen=True)
class Plan:
    op: str
    variant: str
    passes: tuple
    inputs: Mapping[str, tuple]
    outputs: Mapping[str, tuple]
    intermediates: Mapping[str, tuple]
    explanation: tuple
    chunks: tuple = ()  # Chunk pieces of a tensor too large for one binding; passes then empty


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


WORKGROUP_LIMITS = ("maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX")


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
    for name in WORKGROUP_LIMITS:
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


_ITEMSIZE = {"float32": 4, "float16": 2}
_NP_DTYPES = {"float32": np.dtype("float32"), "float16": np.dtype("float16")}  # dtype.name is slow


def _storage_nbytes(shape, dtype_name):
    """Bytes of a tensor's buffer: copies and reads need multiples of 4, and never 0."""
    itemsize = _ITEMSIZE.get(dtype_name) or np.dtype(dtype_name).itemsize
    nbytes = math.prod(shape) * itemsize
    return max(4, -(-nbytes // 4) * 4)


def check_binding_sizes(op, plan, caps, names=None):
    """Refuse tensors whose buffers exceed the device's buffer or storage-binding size.

    A chunked plan binds its whole tensors only in pieces, so only maxBufferSize applies to them.
    """
    names = names or {}
    for kind, group in (("input", plan.inputs), ("output", plan.outputs), ("intermediate", plan.intermediates)):
        limits = ("maxBufferSize",) if plan.chunks and kind != "intermediate" else ("maxStorageBufferBindingSize", "maxBufferSize")
        for key, (shape, dtype_name) in group.items():
            nbytes = _storage_nbytes(shape, dtype_name)
            for name in limits:
                if nbytes > caps.limits[name]:
                    raise ContractError(
                        op,
                        f"{kind} {names.get(key, key)}",
                        name,
                        f"{tuple(shape)} {dtype_name} needs {nbytes} bytes, over {name} = {caps.limits[name]}",
                    )


# ---------------------------------------------------------------------------------------------
# Variant selection

_REJECTING_ERRORS = (ArithmeticError, IndexError, ValueError, TypeError, KeyError)


def candidate_verdict(candidate, request, derived):
    """Why a candidate cannot run this request (its features, then its when clauses), or None."""
    missing = [f for f in candidate.REQUIRED_FEATURES if f not in request.caps.features]
    if missing:
        return f"needs device feature {', '.join(missing)} (the device has: {features_text(request.caps.features)})"
    try:
        return candidate.when(request, derived)
    except _REJECTING_ERRORS as e:
        # A rule that cannot be evaluated for these inputs does not hold.
        return f"when could not be evaluated: {type(e).__name__}: {e}"


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
        failed = candidate_verdict(c, request, derived)
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


def default_device() -> Any:
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


def checked_shape(op, subject, value):
    """A shape as a tuple of ints; anything that is not a sequence of whole numbers >= 0 is refused."""
    if type(value) is tuple and all(type(d) is int and d >= 0 for d in value):
        return value  # the common case, cheaply
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ContractError(op, subject, "shape", f"a shape is a sequence of whole numbers, got {value!r}")
    dims = []
    for d in value:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise ContractError(op, subject, "whole dimensions", f"dimension {d!r} of {tuple(value)!r} is not a whole number")
        if d < 0:
            raise ContractError(op, subject, "dimensions >= 0", f"dimension {int(d)} of {tuple(value)!r} is negative")
        dims.append(int(d))
    return tuple(dims)


class Tensor:
    """A tensor resident on a GPU: a storage buffer with a shape and a dtype.

    The buffer is padded to a multiple of 4 bytes (an f16 tensor of odd length) and is at least
    4 bytes, so that copies, reads and bindings are valid; the padding is never visible.
    A Tensor made over a caller's own buffer is checked when a call uses it: the buffer must hold
    the shape's bytes (padded to 4) and have the usages the call needs.
    """

    __slots__ = ("buffer", "shape", "dtype", "device", "storage_nbytes", "destroyed")

    def __init__(self, buffer: Any, shape: abc.Sequence[int], dtype: Any, device: Any) -> None:
        self.buffer = buffer
        self.shape: tuple[int, ...] = checked_shape("Tensor", "shape", shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        # The bytes a binding of the whole tensor covers: its bytes padded to a multiple of 4.
        self.storage_nbytes = _storage_nbytes(self.shape, self.dtype.name)
        self.destroyed = False  # set by destroy(): a call or a read-back of it is then refused

    @property
    def nbytes(self) -> int:
        return numel(self.shape) * self.dtype.itemsize

    @classmethod
    def empty(cls, shape: abc.Sequence[int], dtype: Any, device: Any = None, usage: int | None = None) -> Tensor:
        device = device if device is not None else default_device()
        shape = checked_shape("Tensor", "shape", shape)
        size = _storage_nbytes(shape, np.dtype(dtype).name)
        buffer = device.create_buffer(size=size, usage=_buffer_usage() if usage is None else usage)
        return cls(buffer, shape, dtype, device)

    @classmethod
    def from_numpy(cls, array: Any, device: Any = None, usage: int | None = None) -> Tensor:
        array = np.asarray(array)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        array = np.ascontiguousarray(array)
        tensor = cls.empty(array.shape, array.dtype, device, usage)
        data = array.tobytes()
        if len(data) % 4:
            data += bytes(4 - len(data) % 4)
        if data:
            tensor.device.queue.write_buffer(tensor.buffer, 0, data)
        return tensor

    def numpy(self) -> np.ndarray:
        """Read the tensor back (waits for the GPU work that writes it)."""
        if self.destroyed:
            raise ContractError("Tensor", "numpy()", "not destroyed", "the Tensor was destroyed: its buffer is gone")
        if numel(self.shape) == 0:
            return np.empty(self.shape, self.dtype)
        data = self.device.queue.read_buffer(self.buffer, 0, self.storage_nbytes)
        return np.frombuffer(data, self.dtype, count=numel(self.shape)).reshape(self.shape)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """numpy.asarray(tensor): a blocking read-back (waits for the GPU work that writes it)."""
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def destroy(self) -> None:
        """Free the GPU buffer now rather than when the Tensor is collected; the Tensor is unusable after
        (calls and read-backs refuse it). Destroying `tensor.buffer` directly bypasses that check, and
        wgpu-native may then abort the process at the next use: call this instead."""
        self.destroyed = True
        self.buffer.destroy()

    def __enter__(self) -> Tensor:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.destroy()
        return False

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name})"


# What the public calls take and give for a tensor: a numpy array or a device Tensor.
TensorIn = Union[np.ndarray, Tensor]


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
            values.append(_f32(uniforms[name], f"uniform {name}"))
    return struct.pack("<" + "".join(formats[typ] for _, typ in uniform_types), *values)


def _f32(value, what):
    """value as a float that a WGSL f32 holds: finite and within the f32 range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PlanError("plan", what, "finite f32", f"expected a number, got {value!r}")
    x = float(value)
    if not (math.isfinite(x) and abs(x) <= 3.4028234663852886e38):
        raise PlanError("plan", what, "finite f32", f"expected a finite 32-bit float, got {value!r}")
    return x


def _override_constants(pass_plan):
    return _override_constants_of(pass_plan.overrides, pass_plan.override_types)


def _override_constants_of(overrides, override_types):
    constants = {}
    for name, value in overrides.items():
        typ = override_types.get(name, "f32")
        if typ == "u32":
            constants[name] = u32(value, f"override {name}")
        elif typ == "i32":
            constants[name] = _i32(value, f"override {name}")
        else:
            constants[name] = float(value)
    return constants


# Per-device caches, each bounded: weak keys so that a caller's device and its pipelines go away
# together, and LRU eviction so that an app with changing shapes keeps a bounded set alive.
# Evicted objects are dropped, never destroyed: work already submitted keeps what it uses alive.
PIPELINE_CACHE_SIZE = 1024  # every pipeline the shipped cases reach on one device is about 320
UNIFORM_CACHE_SIZE = 1024
_shader_modules = weakref.WeakKeyDictionary()  # device -> LRUCache {wgsl: module}
_bind_group_layouts = weakref.WeakKeyDictionary()  # device -> LRUCache {layout key: layout}
_pipelines = weakref.WeakKeyDictionary()  # device -> LRUCache {(wgsl, overrides, layout key): (pipeline, layout)}
_uniform_buffers = weakref.WeakKeyDictionary()  # device -> LRUCache {packed bytes: buffer}
pipeline_creations = 0  # how many compute pipelines this process created: tests and warm-up read it


def _layout_key(pass_plan):
    return tuple((b.index, b.buffer) for b in pass_plan.bindings)


def _bind_group_layout(device, key):
    import wgpu

    cache = _per_device(_bind_group_layouts, device, PIPELINE_CACHE_SIZE)
    layout = cache.get(key)
    if layout is None:
        layout = device.create_bind_group_layout(
            entries=[
                {"binding": index, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": buffer}}
                for index, buffer in key
            ]
        )
        cache.put(key, layout)
    return layout


def _shader_module(device, pass_plan):
    modules = _per_device(_shader_modules, device, PIPELINE_CACHE_SIZE)
    module = modules.get(pass_plan.wgsl)
    if module is None:
        module = device.create_shader_module(label=pass_plan.label, code=pass_plan.wgsl)
        modules.put(pass_plan.wgsl, module)
    return module


def _pipeline(device, pass_plan):
    """(pipeline, bind group layout) for a pass, created once per device, WGSL and overrides."""
    cached = _cached_pipeline(device, pass_plan)
    if cached is None:
        promise, bind_group_layout = _start_pipeline(device, pass_plan)
        cached = _finish_pipeline(device, pass_plan, promise.sync_wait(), bind_group_layout)
    return cached


def _pipeline_key(pass_plan):
    constants = pass_plan.pipeline_constants or tuple(sorted(_override_constants(pass_plan).items()))
    return (pass_plan.wgsl, constants, _layout_key(pass_plan))


def _cached_pipeline(device, pass_plan):
    return _per_device(_pipelines, device, PIPELINE_CACHE_SIZE).get(_pipeline_key(pass_plan))


def _start_pipeline(device, pass_plan):
    """Begin creating a pass's pipeline with wgpu's asynchronous call (synchronous in wgpu-native
    0.32, which has no asynchronous pipeline creation yet: the promise is then already resolved)."""
    # An explicit layout from the plan's bindings: layout="auto" drops bindings the shader
    # does not use, and a bind group holding them is then refused.
    bind_group_layout = _bind_group_layout(device, _layout_key(pass_plan))
    promise = device.create_compute_pipeline_async(
        label=pass_plan.label,
        layout=device.create_pipeline_layout(bind_group_layouts=[bind_group_layout]),
        compute={"module": _shader_module(device, pass_plan), "entry_point": "main", "constants": dict(_pipeline_key(pass_plan)[1])},
    )
    return promise, bind_group_layout


def _finish_pipeline(device, pass_plan, pipeline, bind_group_layout):
    global pipeline_creations
    pipeline_creations += 1
    cached = (pipeline, bind_group_layout)
    _per_device(_pipelines, device, PIPELINE_CACHE_SIZE).put(_pipeline_key(pass_plan), cached)
    return cached


def warm_pipelines(device, passes):
    """Create every missing pipeline of `passes`: all requests first, then the waits."""
    started = []
    for pass_plan in passes:
        if _cached_pipeline(device, pass_plan) is None and _pipeline_key(pass_plan) not in {_pipeline_key(p) for p, _, _ in started}:
            started.append((pass_plan, *_start_pipeline(device, pass_plan)))
    for pass_plan, promise, bind_group_layout in started:
        _finish_pipeline(device, pass_plan, promise.sync_wait(), bind_group_layout)
    return len(started)


def _usage_names(flags):
    import wgpu

    return [name for name in ("STORAGE", "COPY_SRC", "COPY_DST", "UNIFORM") if flags & getattr(wgpu.BufferUsage, name)]


# WebGPU's GPUBufferUsage flags (the values wgpu.BufferUsage has), without importing wgpu here.
_USAGE_FLAGS = {"COPY_SRC": 0x04, "COPY_DST": 0x08, "UNIFORM": 0x40, "STORAGE": 0x80}


def check_tensor_buffer(op, subject, tensor, usages):
    """Refuse a Tensor whose buffer cannot back its shape, or lacks a usage the call needs.

    A Tensor of no elements is never bound, so its buffer may be anything, 0 bytes included.
    """
    if tensor.destroyed:
        raise ContractError(op, subject, "not destroyed", "the Tensor was destroyed: its buffer is gone")
    if numel(tensor.shape) == 0:
        return
    need = tensor.storage_nbytes
    size = tensor.buffer.size
    if size < need:
        padded = " (its bytes padded to a multiple of 4)" if need != tensor.nbytes else ""
        raise ContractError(
            op,
            subject,
            "buffer size",
            f"the Tensor's buffer holds {size} bytes, but a {tensor.shape} {tensor.dtype.name} tensor needs {need}{padded}",
        )
    flags = tensor.buffer.usage
    missing = [u for u in usages if not flags & _USAGE_FLAGS[u]]
    if missing:
        has = " | ".join(_usage_names(tensor.buffer.usage)) or "none of STORAGE, COPY_SRC, COPY_DST"
        raise ContractError(
            op,
            subject,
            "buffer usage",
            f"the Tensor's buffer needs usage {' | '.join(missing)}; it was created with {has}",
        )


def _checked_tensor(op, subject, value, spec, device):
    shape, dtype_name = spec
    expected = _NP_DTYPES.get(dtype_name) or np.dtype(dtype_name)
    if value.shape != tuple(shape) or value.dtype != expected or not value.dtype.isnative:
        raise ContractError(
            op,
            subject,
            "planned shape and dtype",
            f"got {value.shape} {_dtype_text(value.dtype)}, the plan is for {tuple(shape)} {dtype_name}",
        )
    if isinstance(value, Tensor):
        if value.device is not device:
            raise ContractError(op, subject, "same device", "the tensor lives on another device than the call")
        check_tensor_buffer(op, subject, value, ("STORAGE",))
    return value


def _dtype_text(dtype):
    return dtype.name if dtype.isnative or dtype.byteorder == "|" else f"{dtype.name} ({dtype.str}, big-endian)"


@dataclass(frozen=True)
class BoundPass:
    """One pass ready to encode: its pipeline, its bind group and its workgroup counts."""

    label: str
    pipeline: object
    bind_group: object
    dispatch: tuple


@dataclass(frozen=True)
class BufferSlice:
    """The bytes of a buffer a binding sees: a whole tensor, or one chunk of it."""

    buffer: object
    offset: int
    size: int


def whole_tensor(tensor):
    return BufferSlice(tensor.buffer, 0, tensor.storage_nbytes)


def _uniform_buffer(device, pass_plan):
    """One read-only uniform buffer per distinct content and device, reused by every call."""
    import wgpu

    data = pass_plan.uniform_data or pack_uniforms(pass_plan.uniform_types, pass_plan.uniforms)
    buffers = _per_device(_uniform_buffers, device, UNIFORM_CACHE_SIZE)
    buffer = buffers.get(data)
    if buffer is None:
        buffer = device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.UNIFORM)
        buffers.put(data, buffer)
    return buffer


def bind_passes(passes, tensors, device):
    """Pipelines and uniform buffers (both cached per device) and bind groups for passes.

    `tensors` maps each binding kind ("input", "output", "intermediate") to {key: Tensor or
    BufferSlice}.
    """
    bound = []
    for pass_plan in passes:
        pipeline, bind_group_layout = _pipeline(device, pass_plan)
        bind_group = _bind_group(device, bind_group_layout, _binding_views(pass_plan, tensors, device))
        bound.append(BoundPass(pass_plan.label, pipeline, bind_group, tuple(pass_plan.dispatch)))
    return bound


def _binding_views(pass_plan, tensors, device):
    """(binding index, BufferSlice) of every binding of a pass, its uniform buffer included."""
    views = []
    for b in pass_plan.bindings:
        if b.kind == "uniform":
            buffer = _uniform_buffer(device, pass_plan)
            view = BufferSlice(buffer, 0, buffer.size)
        else:
            view = tensors[b.kind][b.resource]
            if isinstance(view, Tensor):
                view = whole_tensor(view)
        views.append((b.index, view))
    return views


def bind_group_entries(pass_plan, tensors, device):
    """The `create_bind_group` entries of a pass over given tensors (what the cache saves making)."""
    return [
        {"binding": index, "resource": {"buffer": v.buffer, "offset": v.offset, "size": v.size}}
        for index, v in _binding_views(pass_plan, tensors, device)
    ]


BIND_GROUP_CACHE_SIZE = 1024
_bind_groups = weakref.WeakKeyDictionary()  # device -> LRUCache {(layout, views): (bind group, weak refs)}


def _bind_group(device, layout, entries):
    """A bind group per (layout, buffer ranges), cached: a repeated call on the same Tensors
    builds nothing. The key holds ids, so a hit is checked against weak references to the layout
    and the buffers it was made with: a buffer that died and left its id to another never matches."""
    key = (id(layout), tuple((index, id(v.buffer), v.offset, v.size) for index, v in entries))
    cache = _per_device(_bind_groups, device, BIND_GROUP_CACHE_SIZE)
    hit = cache.get(key)
    if hit is not None:
        bind_group, refs = hit
        if refs[0]() is layout and all(ref() is v.buffer for ref, (_, v) in zip(refs[1:], entries)):
            return bind_group
    bind_group = device.create_bind_group(
        layout=layout,
        entries=[{"binding": index, "resource": {"buffer": v.buffer, "offset": v.offset, "size": v.size}} for index, v in entries],
    )
    entry = [bind_group, None]
    entry[1] = (weakref.ref(layout),) + _watching(cache, key, entry, [v.buffer for _, v in entries])
    cache.put(key, entry)
    return bind_group


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


def _plan_inputs(plan, inputs):
    """The plan's inputs from the caller's values: present, right shape and dtype, one device."""
    missing = [key for key in plan.inputs if inputs.get(key) is None]
    if missing:
        raise ContractError(plan.op, f"input {missing[0]}", "required input", f"required input {missing[0]} is missing")
    values = {key: inputs[key] for key in plan.inputs}
    tensors = [v for v in values.values() if isinstance(v, Tensor)]
    return values, tensors


def _checked_out(plan, out, values, device, names):
    """The `out=` Tensors, each checked: a Tensor, a planned output, the right shape, no aliasing."""
    if not out:
        return {}
    if not isinstance(out, Mapping):
        raise ContractError(plan.op, "out", "a mapping", f"out= maps output names to Tensors, got {type(out).__name__}")
    taken = {id(v.buffer): f"input {names.get(k, k)}" for k, v in values.items() if isinstance(v, Tensor)}
    checked = {}
    for key, tensor in out.items():
        subject = f"out {names.get(key, key)}"
        if key not in plan.outputs:
            raise ContractError(plan.op, subject, "known output", f"this call writes {', '.join(plan.outputs)}")
        if not isinstance(tensor, Tensor):
            raise ContractError(
                plan.op,
                subject,
                "a Tensor",
                f"out= takes device Tensors to write into, got {type(tensor).__name__}; "
                "pass generated.Tensor.empty(shape, dtype) or leave out= and take the returned array",
            )
        _checked_tensor(plan.op, subject, tensor, plan.outputs[key], device)
        check_tensor_buffer(plan.op, subject, tensor, ("STORAGE", "COPY_SRC"))
        other = taken.get(id(tensor.buffer))
        if other is not None and numel(tensor.shape):
            raise ContractError(plan.op, subject, "no aliasing", f"its buffer is also {other}: outputs must not overlap inputs or each other")
        taken[id(tensor.buffer)] = subject
        checked[key] = tensor
    return checked


def run_plan(plan, inputs, device=None, out=None, names=None, encoder=None):
    """Run a plan: upload, allocate, encode every pass, submit once, read back.

    Any input a Tensor -> Tensors out without read-back (they chain on the GPU; numpy inputs
    are uploaded); only numpy inputs -> numpy arrays out. `out` maps output keys to Tensors to
    write into instead of fresh ones. With `encoder`, the call is encoded into that GPUCommandEncoder and not submitted: inputs
    must then be Tensors, and Tensors come back. Everything is checked before the first upload;
    `names` maps keys to the caller's names for the messages.
    """
    names = names or {}
    recorder = "encoder=" if encoder is not None else None
    values, out, device, resident = check_call(plan, inputs, device, out, names, recorder)
    if not plan.passes and not plan.chunks and not resident:
        # Nothing to compute (an empty output): no GPU work at all.
        return {key: _empty_result(shape, dtype_name, out.get(key)) for key, (shape, dtype_name) in plan.outputs.items()}
    return _execute(plan, values, device, out, resident, encoder)


def check_call(plan, inputs, device, out, names, recorder=None):
    """Everything a call is checked for before GPU work; (values, out, device, resident).

    `recorder` names what records the call ("encoder=", "Sequence.kernel()"): its inputs must
    all be Tensors.
    """
    values, resident_inputs = _plan_inputs(plan, inputs)
    # Mixed numpy and Tensor inputs: the numpy ones are uploaded and Tensors come back, so that a
    # chain stays on the GPU once any of its inputs is there.
    resident = bool(resident_inputs)
    if recorder is not None and len(resident_inputs) != len(values):
        numpy_keys = [names.get(k, k) for k, v in values.items() if not isinstance(v, Tensor)]
        raise ContractError(
            plan.op, f"input {numpy_keys[0]}", "Tensors only", f"{recorder} records GPU work, so every input must be a Tensor (Tensor.from_numpy(array))"
        )
    if device is None:
        device = resident_inputs[0].device if resident_inputs else default_device()
    for key, value in values.items():
        _checked_tensor(plan.op, f"input {names.get(key, key)}", value, plan.inputs[key], device)
    out = _checked_out(plan, out, values, device, names)
    checked = _per_device(_plans_fit, device, _PLAN_CACHE_SIZE)
    if checked.get(id(plan)) is not plan:
        check_plan_fits(plan, device_caps(device), names)
        checked.put(id(plan), plan)  # the plan itself is kept, so its id is never reused meanwhile
    return values, out, device, resident


_plans_fit = weakref.WeakKeyDictionary()  # device -> LRUCache {id(plan): plan} of plans this device can run


def check_plan_fits(plan, caps, names=None):
    """Refuse a plan (made for other caps, maybe) that this device cannot run."""
    check_binding_sizes(plan.op, plan, caps, names)
    for pass_plan in plan.passes + tuple(p for c in plan.chunks for p in c.plan.passes):
        check_pass_limits(plan.op, pass_plan, caps)
    check_chunk_offsets(plan, caps)


# Scratch (intermediates, and the (C) ranges a piece copies) comes from one pool per device, reused
# by every call. That is safe because WebGPU runs the commands of a queue in order, and makes each
# dispatch, copy and pass see everything the commands before it wrote: whether two calls share an
# encoder, a submission or neither, the later one's use of a scratch buffer starts after the earlier
# one's ended. Pooled buffers are never destroyed, only dropped when the pool forgets them, so an
# encoder recorded but not yet submitted keeps what it uses alive.
SCRATCH_POOL_SIZE = 256
_scratch = weakref.WeakKeyDictionary()  # device -> LRUCache {(role, nbytes): buffer}


def scratch_buffer(device, role, nbytes):
    """A pooled storage buffer of `nbytes` for `role` (distinct roles never share one)."""
    import wgpu

    pool = _per_device(_scratch, device, SCRATCH_POOL_SIZE)
    key = (role, nbytes)
    buffer = pool.get(key)
    if buffer is None:
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        buffer = device.create_buffer(size=max(4, nbytes), usage=usage)
        pool.put(key, buffer)
    return buffer


def _intermediates(plan, device):
    views = {}
    for key, (shape, dtype_name) in plan.intermediates.items():
        nbytes = _storage_nbytes(shape, dtype_name)
        views[key] = BufferSlice(scratch_buffer(device, ("intermediate", key), nbytes), 0, nbytes)
    return views


@dataclass(frozen=True)
class BufferCopy:
    source: object
    source_offset: int
    target: object
    size: int


@dataclass(frozen=True)
class RecordedCall:
    """One call ready to encode, as often as wanted: copies first, then its dispatches."""

    label: str
    copies: tuple
    bound: tuple


def record_call(plan, tensors, device):
    """Pipelines, uniforms, scratch and bind groups for a plan over given tensors; no encoding.

    `tensors` maps "input" and "output" to {key: Tensor}.
    """
    label = f"{plan.op} {plan.variant}"
    if not plan.chunks:
        views = {**tensors, "intermediate": _intermediates(plan, device)}
        bound = bind_passes([p for p in plan.passes if 0 not in p.dispatch], views, device)
        return RecordedCall(label, (), tuple(bound))
    copies, bound = [], []
    for index, chunk in enumerate(plan.chunks):
        views = {"intermediate": _intermediates(chunk.plan, device)}
        for kind in ("input", "output"):
            views[kind] = {}
            for key, tensor in tensors[kind].items():
                if key in chunk.slices:
                    views[kind][key] = BufferSlice(tensor.buffer, *chunk.slices[key])
                elif key in chunk.copies:
                    offset, size = chunk.copies[key]
                    target = scratch_buffer(device, ("piece", index, key), size)
                    copies.append(BufferCopy(tensor.buffer, offset, target, size))
                    views[kind][key] = BufferSlice(target, 0, size)
                else:
                    views[kind][key] = tensor
        bound += bind_passes([p for p in chunk.plan.passes if 0 not in p.dispatch], views, device)
    return RecordedCall(label, tuple(copies), tuple(bound))


def encode_calls(encoder, calls, label=None):
    """Encode recorded calls: their dispatches in as few compute passes as their copies allow.

    This loop is what `Sequence.run()` costs per recorded op, so it makes only the native calls a
    dispatch needs: no debug group (two native calls each; the pass label names the call), and no
    set_pipeline when the previous dispatch of the pass used the same pipeline (consecutive calls
    of one variant, as in a UNet, share theirs; pipeline state persists within a compute pass).
    """
    compute = None
    for call in calls:
        if call.copies:
            if compute is not None:
                compute.end()
                compute = None
            for c in call.copies:
                encoder.copy_buffer_to_buffer(c.source, c.source_offset, c.target, 0, c.size)
        for item in call.bound:
            if compute is None:
                compute = encoder.begin_compute_pass(label=label or call.label)
                set_pipeline, set_bind_group, dispatch = compute.set_pipeline, compute.set_bind_group, compute.dispatch_workgroups
                current = None
            if item.pipeline is not current:
                set_pipeline(item.pipeline)
                current = item.pipeline
            set_bind_group(0, item.bind_group)
            dispatch(*item.dispatch)
    if compute is not None:
        compute.end()


def check_chunk_offsets(plan, caps):
    """A plan cut for other caps may bind at offsets this device does not allow."""
    align = caps.limits["minStorageBufferOffsetAlignment"]
    for chunk in plan.chunks:
        for key, (offset, size) in chunk.slices.items():
            if offset % align or size > caps.limits["maxStorageBufferBindingSize"]:
                raise PlanError(
                    plan.op,
                    f"piece of {key}",
                    "minStorageBufferOffsetAlignment",
                    f"the plan binds {size} bytes at offset {offset}, which this device does not allow "
                    f"(minStorageBufferOffsetAlignment = {align}, maxStorageBufferBindingSize = "
                    f"{caps.limits['maxStorageBufferBindingSize']}): plan for this device",
                )


def _empty_result(shape, dtype_name, out_tensor):
    return out_tensor.numpy() if out_tensor is not None else np.empty(shape, dtype_name)


def _call_tensors(plan, values, device, out):
    """Inputs as Tensors (numpy ones uploaded) and outputs (out= ones, or fresh); the uploads."""
    uploaded = []
    inputs = {}
    for key, value in values.items():
        if not isinstance(value, Tensor):
            value = Tensor.from_numpy(value, device)
            uploaded.append(value)
        inputs[key] = value
    outputs = {key: out.get(key) or Tensor.empty(shape, dtype_name, device) for key, (shape, dtype_name) in plan.outputs.items()}
    return {"input": inputs, "output": outputs}, uploaded


def _submit(call, device, encoder):
    """Encode a recorded call into the caller's encoder, or into one of ours and submit it."""
    if encoder is not None:
        encode_calls(encoder, [call])
    elif call.bound:  # empty tensors: nothing to dispatch
        own = device.create_command_encoder(label=call.label)
        encode_calls(own, [call])
        device.queue.submit([own.finish()])


def _execute(plan, values, device, out, resident, encoder=None):
    tensors, uploaded = _call_tensors(plan, values, device, out)
    try:
        call = record_call(plan, tensors, device)
        _submit(call, device, encoder)
        if resident:
            return dict(tensors["output"])
        results = {key: tensor.numpy() for key, tensor in tensors["output"].items()}
        for key, tensor in tensors["output"].items():
            if key not in out:
                tensor.buffer.destroy()
        return results
    finally:
        # wgpu frees a destroyed buffer only once the submitted work that uses it is done.
        if encoder is None:
            for tensor in uploaded:
                tensor.buffer.destroy()


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
    key: str  # the shader's name in the op's shaders.py: template stem and varying template values
    bindings: tuple
    uniform_types: tuple
    overrides: tuple  # (name, "u32" | "f32") the shader declares
    workgroup_size: str  # an override name or an integer literal
    workgroup_arrays: tuple  # (bytes per element, factors: override names or integer literals)
    uses_subgroups: bool
    wgsl: str = field(repr=False)


@dataclass(frozen=True)
class Varied:
    """A specialization whose Shader fields differ from the others of its pass (`vary()`)."""

    name: str
    fields: dict


def vary(name: str, **fields: Any) -> Varied:
    return Varied(name, fields)


def shader_table(wgsl: Any, *, template: str, bindings: tuple, uniform_types: tuple, shaders: Mapping, **common: Any) -> dict:
    """{specialization key: Shader} of one pass: the fields every specialization shares, each
    entry's own (`vary`) on top; `wgsl(name)` is the text of a shader in the op's shaders.py."""
    table = {}
    for key, entry in shaders.items():
        name, own = (entry, {}) if isinstance(entry, str) else (entry.name, entry.fields)
        table[key] = Shader(template=template, key=name, bindings=bindings, uniform_types=uniform_types, wgsl=wgsl(name), **{**common, **own})
    return table


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
    chunking: object = None  # ChunkSpec, or None: a tensor over one binding is refused


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

    storage = sum(size * math.prod(factor(t) for t in terms) for size, terms in shader.workgroup_arrays)
    try:
        uniform_data = pack_uniforms(shader.uniform_types, uniforms)
    except PlanError as error:
        raise PlanError(error.op, f"{label}: {error.subject}", error.rule, error.message) from None
    constants = overrides  # already converted and checked by _override_value
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
        workgroup_size_name="" if shader.workgroup_size.isdigit() else shader.workgroup_size,
        pipeline_constants=tuple(sorted(constants.items())),
        uniform_data=uniform_data,
    )


_DTYPE_NAMES = {
    "f32": "float32", "f16": "float16", "float32": "float32", "float16": "float16",
    np.dtype("float32"): "float32", np.dtype("float16"): "float16",
}


def _dtype_name(value):
    """numpy dtypes, ONNX names and WGSL names all mean one of float32 / float16."""
    try:
        text = _DTYPE_NAMES.get(value)
    except TypeError:  # unhashable
        text = None
    if text is None:
        try:
            text = np.dtype(value).name
        except TypeError:
            text = str(value)
    return text


_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)


def _attribute_value(op, name, spec, value):
    """One attribute value checked against its kind and the 32-bit type the kernels give it."""
    subject = f"attribute {name}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ContractError(op, subject, spec.kind, f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ContractError(op, subject, "finite", f"must be a finite number, got {value!r}")
    if spec.kind == "int":
        if not float(value).is_integer():
            raise ContractError(op, subject, "int", f"expected an integer, got {value!r}")
        value = int(value)
        if not -(2**31) <= value < 2**31:
            raise ContractError(op, subject, "32-bit int", f"{value} does not fit the 32-bit integer the kernels use")
        return value
    value = float(value)
    if abs(value) > _F32_MAX:
        raise ContractError(op, subject, "f32 range", f"{value!r} does not fit a 32-bit float (the kernels compute in f32)")
    if 0 < abs(value) < _F32_TINY:
        raise ContractError(op, subject, "f32 range", f"{value!r} is below the smallest normal 32-bit float and would act as 0")
    return value


def _attributes(contract, attrs):
    if attrs is not None and not isinstance(attrs, Mapping):
        raise ContractError(contract.op, "attrs", "a mapping", f"attrs maps attribute names to values, got {type(attrs).__name__}")
    attrs = dict(attrs or {})
    known = {a.name: a for a in contract.attributes}
    unknown = sorted(set(attrs) - set(known))
    if unknown:
        raise ContractError(
            contract.op, f"attribute {unknown[0]}", "known attribute", f"unknown attribute{_suggest(unknown[0], known)}; known: {', '.join(known)}"
        )
    resolved = {}
    for name, spec in known.items():
        if name not in attrs:
            if spec.default is None:
                if spec.required:
                    raise ContractError(contract.op, f"attribute {name}", "required", "the attribute is required and has no default")
                continue
            resolved[name] = spec.default
            continue
        value = _attribute_value(contract.op, name, spec, attrs[name])
        if spec.allowed is not None:
            same = np.float32 if spec.comparison == "float32" else (lambda v: v)
            if not any(same(value) == same(a) for a in spec.allowed):
                allowed = ", ".join(repr(a) for a in spec.allowed)
                raise ContractError(
                    contract.op, f"attribute {name}", f"one of {allowed}", f"{value!r} is not supported (allowed: {allowed})"
                )
        resolved[name] = value
    return resolved


def _suggest(name, known):
    import difflib

    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _requested_outputs(contract, outputs):
    """Bind keys of the outputs asked for (default: the required ones); unknown names refused."""
    by_name = {t.key: t.key for t in contract.outputs} | {t.role: t.key for t in contract.outputs}
    if outputs is None:
        return tuple(t.key for t in contract.outputs if not t.optional)
    if isinstance(outputs, str):
        outputs = (outputs,)
    if not isinstance(outputs, (tuple, list, set, frozenset)) or not all(isinstance(o, str) for o in outputs):
        raise ContractError(contract.op, "outputs", "output names", f"outputs= takes output names, like ('Y', 'S'); got {outputs!r}")
    unknown = [o for o in outputs if o not in by_name]
    if unknown:
        raise ContractError(contract.op, f"output {unknown[0]}", "known output", f"unknown output; outputs are {', '.join(t.role for t in contract.outputs)}")
    return tuple(dict.fromkeys(by_name[o] for o in outputs))


def _given_shapes(contract, shapes):
    """{bind key: shape} and {bind key: the caller's name} from shapes keyed by key or role."""
    if not isinstance(shapes, Mapping):
        raise ContractError(contract.op, "shapes", "a mapping", f"shapes maps input names to shapes, got {type(shapes).__name__}")
    tensors = {t.key: t for t in contract.inputs}
    roles = {t.role: t.key for t in contract.inputs}
    given, names = {}, {}
    for name, shape in shapes.items():
        key = name if name in tensors else roles.get(name)
        if key is None:
            known = list(tensors) + [r for r in roles if r not in tensors]
            raise ContractError(
                contract.op, f"input {name}", "known input", f"unknown input{_suggest(name, known)}; inputs are {', '.join(tensors)}"
            )
        if key in names:
            raise ContractError(
                contract.op, f"input {name}", "one name per input", f"given twice, as {names[key]!r} and {name!r}: pass it once"
            )
        names[key] = name
        if shape is not None:  # None: not given (an optional input left out)
            given[key] = checked_shape(contract.op, f"input {name}", shape)
    for t in contract.inputs:
        if not t.optional and t.key not in given:
            name = names.get(t.key, t.key)
            alias = f" (ONNX name {t.role})" if t.role != name else ""
            raise ContractError(contract.op, f"input {name}", "required input", f"required input {name} is missing{alias}")
    return given, names


def _request_dtypes(contract, dtypes):
    if dtypes is not None and not isinstance(dtypes, Mapping):
        raise ContractError(contract.op, "dtypes", "a mapping", f"dtypes maps type variables to dtypes, got {type(dtypes).__name__}")
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
    return wgsl_dtypes


def _checked_tunables(contract, tunables):
    if tunables is not None and not isinstance(tunables, Mapping):
        raise ContractError(contract.op, "tunables", "a mapping", f"tunables maps names to numbers, got {type(tunables).__name__}")
    unknown_tunables = sorted(set(tunables or {}) - set(contract.tunables))
    if unknown_tunables:
        raise ContractError(contract.op, f"tunable {unknown_tunables[0]}", "known tunable", f"known: {', '.join(contract.tunables)}")
    for name, value in (tunables or {}).items():
        # Workgroup sizes, counts and thresholds: some divide, so 0 is refused with the rest.
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and float(value).is_integer() and 1 <= value < 2**31):
            raise ContractError(contract.op, f"tunable {name}", "a whole number >= 1", f"got {value!r}")
    return {**contract.tunables, **{name: int(value) for name, value in (tunables or {}).items()}}


def _request(contract, shapes, dtypes, attrs, caps, tunables, outputs=None):
    given, names = _given_shapes(contract, shapes)
    wgsl_dtypes = _request_dtypes(contract, dtypes)
    all_tunables = _checked_tunables(contract, tunables)
    wanted = _requested_outputs(contract, outputs)
    roles = {t.key: t.role for t in contract.outputs}
    requested = frozenset(wanted) | frozenset(roles[k] for k in wanted)
    request = Request(given, wgsl_dtypes, _attributes(contract, attrs), all_tunables, caps, requested, names)
    output_shapes = contract.output_shapes(request)
    return Request({**given, **output_shapes}, request.dtypes, request.attrs, request.tunables, caps, requested, names)


def _caller_subject(contract, subject, names):
    """A subject in the caller's words: `input X` becomes `input x` when the caller said `x`."""
    kind, _, name = subject.partition(" ")
    if kind not in ("input", "out", "output"):
        return subject
    for t in contract.inputs + contract.outputs:
        if name in (t.key, t.role) and t.key in names:
            return f"{kind} {names[t.key]}"
    return subject


def _in_callers_words(contract, error, names):
    subject = _caller_subject(contract, error.subject, names)
    op = contract.op if error.op == "plan" else error.op
    if subject == error.subject and op == error.op:
        return error
    return type(error)(op, subject, error.rule, error.message)


def _dtype_names(request, contract):
    spec_of = {t.key: t for t in contract.inputs + contract.outputs}
    return {k: {"f32": "float32", "f16": "float16"}[request.dtypes[spec_of[k].type_var]] for k in request.shapes}


def _check_sizes(contract, request):
    """Tensors over maxBufferSize are refused outright, whatever the variant."""
    names = _dtype_names(request, contract)
    limit = request.caps.limits["maxBufferSize"]
    for t in contract.inputs + contract.outputs:
        if t.key in request.shapes:
            nbytes = _storage_nbytes(request.shapes[t.key], names[t.key])
            if nbytes > limit:
                kind = "input" if t in contract.inputs else "output"
                raise ContractError(
                    contract.op,
                    f"{kind} {request.names.get(t.key, t.role)}",
                    "maxBufferSize",
                    f"{request.shapes[t.key]} {names[t.key]} needs {nbytes} bytes, over the device's maxBufferSize = {limit}",
                )


@dataclass(frozen=True)
class ChunkSpec:
    """The manifest's `chunking`: which tensors a request too large for one binding is cut along."""

    batch: tuple  # bind keys cut along axis 0
    channels: tuple = ()  # bind keys cut along axis 1 within one batch item
    per_channel: tuple = ()  # (C) bind keys cut with the channels (copied into scratch)
    groups_attribute: str | None = None  # channels form this many groups; a piece keeps whole groups


@dataclass(frozen=True)
class Chunk:
    """One piece of a chunked plan: the plan of the piece, and where its tensors' bytes lie.

    `slices` binds a range of a whole tensor's buffer, `copies` copies a range into scratch first
    (a (C) tensor's range rarely starts at a multiple of minStorageBufferOffsetAlignment).
    Both map bind keys to (byte offset, byte size).
    """

    plan: Plan
    slices: Mapping[str, tuple]
    copies: Mapping[str, tuple]


@dataclass(frozen=True)
class _Piece:
    shapes: Mapping[str, tuple]
    attrs: Mapping[str, object]
    slices: Mapping[str, tuple]
    copies: Mapping[str, tuple]


def _pad4(nbytes):
    return -(-nbytes // 4) * 4


def chunk_request(contract, request):
    """The pieces of a request that has a tensor over maxStorageBufferBindingSize, else None.

    Batch items first (the fewest pieces), channel ranges within an item when one item is too
    large; every binding offset a multiple of minStorageBufferOffsetAlignment. Where no cut
    exists, the refusal names the tensor and the limit.
    """
    dtype_names = _dtype_names(request, contract)
    itemsize = {k: np.dtype(v).itemsize for k, v in dtype_names.items()}
    # Kernels count elements in u32: a piece also stays under 2**31 elements of its smallest type.
    limit = min(request.caps.limits["maxStorageBufferBindingSize"], 2**31 * min(itemsize.values()))
    size = {k: _storage_nbytes(request.shapes[k], dtype_names[k]) for k in request.shapes}
    over = sorted((k for k in request.shapes if size[k] > limit), key=lambda k: -size[k])  # largest first
    if not over:
        return None

    def refuse(why):
        key = over[0]
        kind = "input" if key in {t.key for t in contract.inputs} else "output"
        nbytes = _storage_nbytes(request.shapes[key], dtype_names[key])
        return ContractError(
            contract.op,
            f"{kind} {request.names.get(key, key)}",
            "maxStorageBufferBindingSize",
            f"{request.shapes[key]} {dtype_names[key]} needs {nbytes} bytes, over the device's "
            f"maxStorageBufferBindingSize = {limit}, and {why}",
        )

    spec = contract.chunking
    if spec is None:
        raise refuse("this op cannot run in pieces")
    batch = [k for k in spec.batch if k in request.shapes]
    if any(k not in batch for k in over):
        raise refuse(f"the op can cut only {', '.join(spec.batch)}")
    items = request.shapes[batch[0]][0]
    if any(request.shapes[k][0] != items for k in batch):
        raise refuse("the tensors it can cut do not share one batch axis")
    per_item = {k: numel(request.shapes[k]) // items * itemsize[k] for k in batch}
    align = request.caps.limits["minStorageBufferOffsetAlignment"]
    # Outputs, and inputs whose items start on the alignment, are bound in place; the other
    # inputs (a (N, C) skip) have their range copied into scratch, which needs only 4 bytes.
    outputs = {t.key for t in contract.outputs}
    sliced = {k: b for k, b in per_item.items() if k in outputs or b % align == 0}
    copied = {k: b for k, b in per_item.items() if k not in sliced}
    step = math.lcm(*(align // math.gcd(align, b) for b in sliced.values()), *(4 // math.gcd(4, b) for b in copied.values()))
    count = limit // max(per_item.values()) // step * step
    if count >= 1:
        return tuple(_batch_piece(request, sliced, copied, start, min(start + count, items)) for start in range(0, items, count))
    if not spec.channels:
        raise refuse("one batch item alone is over it, and the op cannot cut channels")
    return _channel_pieces(contract, request, spec, itemsize, limit, align, refuse)


def _batch_piece(request, sliced, copied, start, stop):
    shapes = dict(request.shapes)
    for key in {**sliced, **copied}:
        shapes[key] = (stop - start,) + tuple(request.shapes[key][1:])
    slices = {key: (start * b, _pad4((stop - start) * b)) for key, b in sliced.items()}
    copies = {key: (start * b, _pad4((stop - start) * b)) for key, b in copied.items()}
    return _Piece(shapes, dict(request.attrs), slices, copies)


def _channel_pieces(contract, request, spec, itemsize, limit, align, refuse):
    """Pieces of channel ranges within each batch item, whole groups kept together."""
    channels = [k for k in spec.channels if k in request.shapes]
    per_channel = [k for k in spec.per_channel if k in request.shapes]
    if any(k not in channels and k not in per_channel for k in request.shapes):
        raise refuse("one batch item alone is over it, and not every tensor can be cut by channel")
    items, total = request.shapes[channels[0]][:2]
    unit = total // request.attrs[spec.groups_attribute] if spec.groups_attribute else 1
    for key in per_channel:  # a copy moves whole 4-byte words: an f16 range starts at an even channel
        unit = math.lcm(unit, 4 // math.gcd(4, itemsize[key]))
    per_channel_bytes = {k: inner(request.shapes[k], 1) * itemsize[k] for k in channels}
    step = math.lcm(unit, *(align // math.gcd(align, b) for b in per_channel_bytes.values()))
    if items > 1 and any(total * b % align for b in per_channel_bytes.values()):
        raise refuse(f"its batch items do not start at multiples of minStorageBufferOffsetAlignment = {align}")
    count = limit // max(per_channel_bytes.values()) // step * step
    if count < 1:
        raise refuse(f"even the smallest piece it can be cut into ({step} channels) is over it")
    pieces = []
    for item in range(items):
        for first in range(0, total, count):
            last = min(first + count, total)
            shapes = dict(request.shapes)
            for key in channels:
                shapes[key] = (1, last - first) + tuple(request.shapes[key][2:])
            for key in per_channel:
                shapes[key] = (last - first,)
            attrs = dict(request.attrs)
            if spec.groups_attribute:
                attrs[spec.groups_attribute] = (last - first) // (total // request.attrs[spec.groups_attribute])
            slices = {k: ((item * total + first) * b, _pad4((last - first) * b)) for k, b in per_channel_bytes.items()}
            copies = {k: (first * itemsize[k], _pad4((last - first) * itemsize[k])) for k in per_channel}
            pieces.append(_Piece(shapes, attrs, slices, copies))
    return tuple(pieces)


def _chunked_plan(contract, request, variant, pieces):
    """A plan of pieces, each planned like a request of its own (pieces of one size share a plan)."""
    inputs_of = {t.key for t in contract.inputs}
    outputs = tuple(k for k in (t.key for t in contract.outputs) if k in request.outputs)
    plans, chunks = {}, []
    for piece in pieces:
        key = (tuple(sorted(piece.shapes.items())), tuple(sorted(piece.attrs.items())))
        if key not in plans:
            shapes = {k: v for k, v in piece.shapes.items() if k in inputs_of}
            sub_request = _request(contract, shapes, request.dtypes, piece.attrs, request.caps, request.tunables, outputs)
            plans[key] = _plan(contract, Request(**{**sub_request.__dict__, "names": request.names}), variant)
        chunks.append(Chunk(plans[key], piece.slices, piece.copies))
    dtype_names = _dtype_names(request, contract)
    written = {k for c in chunks for k in c.plan.outputs}
    variants = ", ".join(dict.fromkeys(c.plan.variant for c in chunks))
    limit = request.caps.limits["maxStorageBufferBindingSize"]
    explanation = (
        f"chunked: {len(chunks)} pieces, each within maxStorageBufferBindingSize = {limit} and 2**31 "
        f"elements; {len(plans)} distinct piece plan(s), variant {variants}",
    ) + chunks[0].plan.explanation
    return Plan(
        contract.op,
        variants,
        (),
        {k: (request.shapes[k], dtype_names[k]) for k in request.shapes if k in inputs_of},
        {k: (request.shapes[k], dtype_names[k]) for k in request.shapes if k in written},
        {},
        explanation,
        tuple(chunks),
    )


def _plan(contract, request, variant):
    try:
        contract.check_contract(request)
        _check_sizes(contract, request)
        if variant is not None and variant not in [c.ID for c in contract.candidates]:
            known = ", ".join(c.ID for c in contract.candidates)
            raise ContractError(contract.op, "variant", "known variant", f"unknown variant {variant!r}; known: {known}")
        if _is_empty(contract, request):
            return _empty_plan(contract, request, variant)
        chunks = chunk_request(contract, request)
        if chunks is not None:
            return _chunked_plan(contract, request, variant, chunks)
        return _variant_plan(contract, request, variant)
    except ContractError as error:
        raise _in_callers_words(contract, error, request.names) from None


def _derived(contract, request):
    try:
        return contract.derive(request)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as error:
        # The contract passed, so this is a request the manifest did not foresee: refuse it clearly.
        raise ContractError(contract.op, "request", "derive", f"the manifest's derived values cannot be computed: {type(error).__name__}: {error}") from None


def _check_element_counts(contract, request):
    """Kernels count a tensor's elements in u32: a piece over that is refused by name."""
    for t in contract.inputs + contract.outputs:
        count = numel(request.shapes.get(t.key, ()))
        if count >= 2**32:
            kind = "input" if t in contract.inputs else "output"
            raise ContractError(
                contract.op,
                f"{kind} {request.names.get(t.key, t.role)}",
                "u32 element count",
                f"{request.shapes[t.key]} has {count} elements; the kernels count elements in 32-bit "
                "integers, so one piece holds at most 4294967295",
            )


def _variant_plan(contract, request, variant):
    _check_element_counts(contract, request)
    derived = _derived(contract, request)
    contract.check_derived_contract(request, derived)
    chosen, explanation = select(contract.op, contract.candidates, request, derived, variant)
    values = chosen.values(request, derived)
    dtype_names = _dtype_names(request, contract)

    def described(keys):
        return {k: (request.shapes[k], dtype_names[k]) for k in keys}

    inputs = described(t.key for t in contract.inputs if t.key in request.shapes)
    try:
        passes = chosen.passes(request, derived, values)
    except PlanError as error:
        raise PlanError(contract.op, f"variant {chosen.ID}: {error.subject}", error.rule, error.message) from None
    # Requested outputs, and any other output the chosen passes write (allocated, not returned).
    bound = {b.resource for p in passes for b in p.bindings if b.kind == "output"}
    outputs = described(t.key for t in contract.outputs if t.key in request.outputs or t.key in bound)
    intermediates = {k: (tuple(whole(d, f"intermediate {k}") for d in shape), dtype) for k, (shape, dtype) in chosen.intermediates(request, derived, values).items()}
    plan = Plan(contract.op, chosen.ID, passes, inputs, outputs, intermediates, explanation)
    check_binding_sizes(contract.op, plan, request.caps, request.names)
    for pass_plan in passes:
        try:
            check_pass_limits(contract.op, pass_plan, request.caps)
        except PlanError as error:
            name = pass_plan.workgroup_size_name
            if error.rule == "workgroup size" or name not in contract.tunables or error.rule not in WORKGROUP_LIMITS:
                raise
            raise ContractError(
                contract.op, f"tunable {name}", error.rule, f"{name} = {request.tunables[name]} sets the workgroup size of pass {pass_plan.name}: {error.message}"
            ) from None
    return plan


def _is_empty(contract, request):
    """Every requested output has no elements: there is nothing to compute."""
    keys = [t.key for t in contract.outputs if t.key in request.outputs]
    return bool(keys) and all(numel(request.shapes[k]) == 0 for k in keys)


def _empty_plan(contract, request, variant):
    """A plan with no passes: outputs of the contract's (empty) shapes, no dispatch, no scratch."""
    try:  # rules on derived values still hold for an empty request, where they can be computed
        derived = contract.derive(request)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError):
        derived = None
    if derived is not None:
        contract.check_derived_contract(request, derived)
    dtype_names = _dtype_names(request, contract)
    inputs = {t.key: (request.shapes[t.key], dtype_names[t.key]) for t in contract.inputs if t.key in request.shapes}
    outputs = {t.key: (request.shapes[t.key], dtype_names[t.key]) for t in contract.outputs if t.key in request.outputs}
    empty = ", ".join(f"{k} {request.shapes[k]}" for k in outputs)
    explanation = (f"nothing to compute: every output is empty ({empty}); no variant runs and nothing is dispatched",)
    return Plan(contract.op, variant or "none", (), inputs, outputs, {}, explanation)


_PLAN_CACHE_SIZE = 1024
_plans = LRUCache(_PLAN_CACHE_SIZE)  # request key -> (caps, plan): plans are immutable, so a repeated request reuses one
_caps_by_mapping = LRUCache(64)  # canonical caps mapping -> Caps, so that a caps= mapping keeps its plans
_default_caps = []


def _webgpu_default_caps():
    if not _default_caps:
        _default_caps.append(Caps.from_mapping({}))
    return _default_caps[0]


def _typed_items(mapping):
    """Items with their types: the plan cache must not take True for 1 (they hash alike).

    In the caller's order, unsorted: the same request in another order is only another entry."""
    return tuple([(k, v.__class__, v) for k, v in mapping.items()])


def _shape_key(shape):
    if type(shape) is tuple and all([type(d) is int for d in shape]):
        return shape
    return (type(shape), tuple(map(type, shape)), tuple(shape))


def _plan_key(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs):
    """The memo key of a request, or None for one that cannot be a key (refused while planning)."""
    try:
        key = (
            contract.op,
            tuple([(k, _shape_key(v)) for k, v in shapes.items()]),
            _typed_items(dtypes) if dtypes else None,
            _typed_items(attrs) if attrs else None,
            _typed_items(tunables) if tunables else None,
            id(caps),
            variant,
            outputs if outputs is None or isinstance(outputs, str) else tuple(outputs),
        )
        hash(key)
        return key
    except (TypeError, AttributeError):
        return None  # not a mapping, unhashable values: plan without the cache


def _cached_plan(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs):
    """_plan() of the request, memoised: a repeated call costs one dictionary lookup."""
    key = _plan_key(contract, shapes, dtypes, attrs, caps, tunables, variant, outputs)
    cached = _plans.get(key) if key is not None else None
    if cached is not None and cached[0] is caps:
        return cached[1]
    plan = _plan(contract, _request(contract, shapes, dtypes, attrs, caps, tunables, outputs), variant)
    if key is not None:
        _plans.put(key, (caps, plan))
    return plan


def planning_caps(caps, device):
    """The Caps a plan is made for: the device's, a given Caps, a mapping (memoised), or WebGPU's defaults."""
    if caps is None and device is None:
        return _webgpu_default_caps()
    if isinstance(caps, Mapping):
        try:
            key = tuple(sorted([(k, tuple(sorted(v.items())) if isinstance(v, Mapping) else tuple(sorted(v))) for k, v in caps.items()]))
            hash(key)
        except (TypeError, AttributeError):
            return caps_of(caps, device)
        cached = _caps_by_mapping.get(key)
        if cached is None:
            cached = caps_of(caps, device)
            _caps_by_mapping.put(key, cached)
        return cached
    return caps_of(caps, device)


def _op_caps(contract, caps, device):
    """planning_caps(), with a refusal of the caps themselves naming the op."""
    try:
        return planning_caps(caps, device)
    except ContractError as error:
        if error.op != "caps":
            raise
        raise ContractError(contract.op, f"caps {error.subject}", error.rule, error.message) from None


def build_plan(contract, shapes, dtypes=None, attrs=None, *, caps=None, tunables=None, variant=None, device=None, outputs=None):
    """plan(): contract checks, derive, selection and every pass's values; no GPU work.

    Without caps= or device=, plans for WebGPU's default limits and no optional features.
    """
    return _cached_plan(contract, shapes, dtypes, attrs, _op_caps(contract, caps, device), tunables, variant, outputs)


def explain_plan(contract, shapes, dtypes=None, attrs=None, *, caps=None, tunables=None, device=None, outputs=None):
    """Why each candidate was or was not taken; for a refused request, the broken rule first."""
    try:
        plan = build_plan(contract, shapes, dtypes, attrs, caps=caps, tunables=tunables, device=device, outputs=outputs)
    except ContractError as error:
        return "\n".join((f"refused: {error}",) + _candidate_lines(contract, shapes, dtypes, attrs, caps, device, tunables, outputs))
    return "\n".join(plan.explanation)


def _candidate_lines(contract, shapes, dtypes, attrs, caps, device, tunables, outputs):
    """Each candidate's own verdict on a refused request, where the request can be evaluated at all."""
    try:
        request = _request(contract, shapes, dtypes, attrs, _op_caps(contract, caps, device), tunables, outputs)
        derived = contract.derive(request)
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError):
        return ()
    lines = []
    for c in contract.candidates:
        reason = candidate_verdict(c, request, derived)
        lines.append(f"{c.ID} (priority {c.PRIORITY}): " + (f"rejected: {reason}" if reason else "its own rules pass"))
    return tuple(lines)


def _kernel_input(op, name, value):
    """A Tensor as it is; anything else as a native-order numpy array (big-endian data converted)."""
    if isinstance(value, Tensor):
        return value
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise ContractError(op, f"input {name}", "an array", f"expected a numpy array or Tensor, got {type(value).__name__}: {error}") from None
    if array.dtype.kind not in "fiub":
        raise ContractError(
            op, f"input {name}", "an array", f"expected a float32 or float16 numpy array or Tensor, got {type(value).__name__} of dtype {array.dtype}"
        )
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _kernel_inputs(contract, inputs):
    """{bind key: value} and {bind key: the caller's name}; None means an input left out."""
    if not isinstance(inputs, Mapping):
        raise ContractError(contract.op, "inputs", "a mapping", f"inputs maps input names to arrays or Tensors, got {type(inputs).__name__}")
    tensors = {t.key: t for t in contract.inputs}
    roles = {t.role: t.key for t in contract.inputs}
    values, names = {}, {}
    for name, value in inputs.items():
        key = name if name in tensors else roles.get(name)
        if key is None:
            known = list(tensors) + [r for r in roles if r not in tensors]
            raise ContractError(contract.op, f"input {name}", "known input", f"unknown input{_suggest(name, known)}; inputs are {', '.join(tensors)}")
        if key in names:
            raise ContractError(contract.op, f"input {name}", "one name per input", f"given twice, as {names[key]!r} and {name!r}: pass it once")
        names[key] = name
        if value is not None:
            values[key] = _kernel_input(contract.op, name, value)
    return values, names


def _input_dtypes(contract, values, names):
    tensors = {t.key: t for t in contract.inputs}
    dtypes, first = {}, {}
    for key, value in values.items():
        name = _dtype_name(value.dtype)
        type_var = tensors[key].type_var
        allowed = contract.type_constraints[type_var]
        subject = f"input {names[key]}"
        if isinstance(value, Tensor) and not (value.dtype.isnative or value.dtype.byteorder == "|"):
            raise ContractError(contract.op, subject, "little-endian", f"a Tensor's dtype must be native ({_dtype_text(value.dtype)}): GPU buffers hold little-endian data")
        if name not in allowed:
            hint = f" (convert with .astype(numpy.{allowed[0]}))" if value.dtype.kind in "fiub" else ""
            raise ContractError(contract.op, subject, f"{type_var} in {', '.join(allowed)}", f"dtype {name} is not supported{hint}")
        if dtypes.setdefault(type_var, name) != name:
            raise ContractError(
                contract.op, subject, f"one dtype for {type_var}",
                f"dtype {name} differs from {first[type_var]}'s {dtypes[type_var]}: every {type_var} tensor must share one dtype",
            )
        first.setdefault(type_var, names[key])
    return dtypes


def _output_names(contract, out):
    """out= keyed by bind key, and the caller's names of those outputs."""
    if out is None:
        return {}, {}
    if not isinstance(out, Mapping):
        raise ContractError(contract.op, "out", "a mapping", f"out= maps output names to Tensors, got {type(out).__name__}")
    by_name = {t.key: t.key for t in contract.outputs} | {t.role: t.key for t in contract.outputs}
    keyed, names = {}, {}
    for name, tensor in out.items():
        key = by_name.get(name)
        if key is None:
            raise ContractError(contract.op, f"out {name}", "known output", f"unknown output; outputs are {', '.join(t.key for t in contract.outputs)}")
        if key in keyed:
            raise ContractError(contract.op, f"out {name}", "one name per output", f"given twice, as {names[key]!r} and {name!r}")
        keyed[key], names[key] = tensor, name
    return keyed, names


def _call_plan(contract, inputs, attrs, outputs, device, variant, caps, tunables):
    """The checked inputs, the caller's names, the device and the plan of one kernel() call."""
    values, names = _kernel_inputs(contract, inputs)
    dtypes = _input_dtypes(contract, values, names)
    shapes = {names[key]: (value.shape if type(value.shape) is tuple else tuple(value.shape)) for key, value in values.items()}
    shapes.update({names[key]: None for key in names if key not in values})
    if device is None:
        device = next((v.device for v in values.values() if isinstance(v, Tensor)), None) or default_device()
    plan = _cached_plan(contract, shapes, dtypes, attrs, _op_caps(contract, caps, device), tunables, variant, outputs)
    return values, names, device, plan


def run_kernel(contract, inputs, attrs=None, *, outputs=None, device=None, variant=None, caps=None, tunables=None, out=None, encoder=None):
    """kernel(): infer shapes and dtypes from the inputs, plan, run; everything checked first.

    With `encoder`, the op is recorded into that GPUCommandEncoder and nothing is submitted.
    """
    repeat_key = _repeat_key(contract, inputs, attrs, outputs, variant, caps, tunables, out)
    if repeat_key is not None:
        repeat = _repeated_call(repeat_key, device, inputs, out)
        if repeat is not None:  # the same Tensors and options as a recent call: encode it again
            _submit(repeat.call, repeat.device, encoder)
            return {key: out[name] for key, name in repeat.returns}
    values, names, device, plan = _call_plan(contract, inputs, attrs, outputs, device, variant, caps, tunables)
    wanted = _requested_outputs(contract, outputs)
    keyed_out, out_names = _output_names(contract, out)
    try:
        if repeat_key is not None and plan.passes and set(plan.outputs) <= set(keyed_out):
            return _run_remembered(repeat_key, plan, values, device, (inputs, out), (keyed_out, {**names, **out_names}, out_names), encoder, wanted)
        results = run_plan(plan, values, device, keyed_out, {**names, **out_names}, encoder)
    except ContractError as error:
        raise _in_callers_words(contract, error, names) from None
    return {o: results[o] for o in wanted}


# kernel() again with the same Tensors, attributes and options as a recent call (an app's loop over
# resident tensors with out=) encodes the call recorded then: nothing is planned, checked or looked
# up anew. What could differ is checked on every hit: each Tensor still has the buffer, shape and
# dtype it had, and is not destroyed; anything else falls back to the full path, which refuses
# what it refused before. Entries drop out once a buffer they bind is collected (`_watching`).
REPEATED_CALLS_SIZE = 256
_repeated_calls = weakref.WeakKeyDictionary()  # device -> LRUCache {repeat key: RepeatedCall}


@dataclass(frozen=True)
class RepeatedCall:
    device: object
    call: RecordedCall
    described: tuple  # (shape, dtype) of each input, then of each out= Tensor, in the caller's order
    returns: tuple  # (output key, the caller's out= name) of each output returned


def _repeat_key(contract, inputs, attrs, outputs, variant, caps, tunables, out):
    """The memo key of a call on resident Tensors with out=, or None for any other call."""
    if caps is not None or not isinstance(inputs, Mapping) or not isinstance(out, Mapping) or not out:
        return None
    if not all(v is None or type(v) is Tensor for v in inputs.values()) or not all(type(t) is Tensor for t in out.values()):
        return None
    if not all(isinstance(m, Mapping) or m is None for m in (attrs, tunables)):
        return None
    key = (
        id(contract),
        tuple((name, id(v)) for name, v in inputs.items()),
        tuple((name, id(t)) for name, t in out.items()),
        _typed_items(attrs or {}),
        outputs if outputs is None or isinstance(outputs, str) else tuple(outputs) if isinstance(outputs, (list, tuple)) else None,
        variant,
        _typed_items(tunables or {}),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _tensors_in_order(inputs, out):
    return [v for v in inputs.values() if v is not None] + list(out.values())


def _repeated_call(key, device, inputs, out):
    """The remembered call of `key`, if every Tensor is still the one it was made with."""
    current = _tensors_in_order(inputs, out)
    cache = _repeated_calls.get(device if device is not None else current[0].device)
    entry = cache.get(key) if cache is not None else None
    if entry is None:
        return None
    repeat, buffer_refs = entry
    if len(current) != len(buffer_refs):
        return None
    for tensor, ref, (shape, dtype) in zip(current, buffer_refs, repeat.described):
        if tensor.destroyed or tensor.buffer is not ref() or tensor.shape != shape or tensor.dtype != dtype:
            return None
    return repeat


def _run_remembered(key, plan, values, device, callers, keyed, encoder, wanted):
    """The full path of a call that can repeat: checked, recorded, run, then remembered.

    `callers` is the caller's (inputs, out); `keyed` is (out by bind key, every name, out names).
    """
    keyed_out, names, out_names = keyed
    values, checked_out, device, _ = check_call(plan, values, device, keyed_out, names, None if encoder is None else "encoder=")
    tensors, _ = _call_tensors(plan, values, device, checked_out)
    call = record_call(plan, tensors, device)
    _submit(call, device, encoder)
    ordered = _tensors_in_order(*callers)
    repeat = RepeatedCall(device, call, tuple((t.shape, t.dtype) for t in ordered), tuple((k, out_names[k]) for k in wanted))
    cache = _per_device(_repeated_calls, device, REPEATED_CALLS_SIZE)
    entry = [repeat, None]
    entry[1] = _watching(cache, key, entry, [t.buffer for t in ordered])
    cache.put(key, entry)
    return {k: checked_out[k] for k in wanted}


def warm_up(contract, shapes, dtypes=None, attrs=None, *, device=None, caps=None, tunables=None, variant=None, outputs=None):
    """warmup(): the plan for these shapes, with every pipeline it needs created on `device`.

    Plans for the device's own capabilities unless `caps` is given; returns the plan.
    """
    device = device if device is not None else default_device()
    plan = build_plan(contract, shapes, dtypes, attrs, caps=caps, tunables=tunables, variant=variant, device=device, outputs=outputs)
    warm_pipelines(device, plan.passes + tuple(p for c in plan.chunks for p in c.plan.passes))
    return plan


def warm_cases(packages, device=None):
    """`generated.warmup()`: create, on `device`, the pipelines that every variant of every op
    needs for the op's shipped test and bench cases, with the default tunables; returns how many
    pipelines were made.

    Since shapes reach shaders through Params, a variant's pipelines depend only on its shader
    specializations and on its power-of-two workgroup buckets, so these cases reach nearly all of a
    device's pipelines; values a manifest keeps as `pipelineConstants` are the exception. A
    variant that does not apply to a case (a feature the device lacks, a shape rule) is skipped.
    """
    device = device if device is not None else default_device()
    before = pipeline_creations
    for op, cases in packages:
        all_outputs = tuple(t.key for t in op.OUTPUTS)
        for entry in list(cases.TEST_CASES) + list(cases.BENCH_CASES):
            for dtypes in _dtype_combinations(entry["dtypes"]):
                for candidate in op.CANDIDATES:
                    given = entry.get("outputs")
                    for outputs in dict.fromkeys((tuple(given) if given is not None else None, all_outputs)):
                        try:
                            op.warmup(entry["inputs"], dtypes, entry.get("attrs"), device=device, variant=candidate.ID, outputs=outputs)
                        except ContractError:
                            continue
    return pipeline_creations - before


def _dtype_combinations(dtypes):
    """Every {type variable: dtype} a case entry names (a value may be one dtype or a list)."""
    import itertools

    names = list(dtypes)
    choices = [dtypes[n] if isinstance(dtypes[n], list) else [dtypes[n]] for n in names]
    return [dict(zip(names, combination)) for combination in itertools.product(*choices)]


class Sequence:
    """Calls recorded once and replayed with one submit: what CUDA graphs and ONNX Runtime's
    graph capture give their users.

    `kernel()` plans, checks, allocates the outputs and builds pipelines, uniforms and bind groups
    once, and returns the output Tensors; `run()` encodes every recorded dispatch into one command
    buffer and submits it, reading whatever the input Tensors hold then (write new data between
    runs with `queue.write_buffer`). Nothing is planned, allocated or created per `run()`.
    Intermediates come from the device's scratch pool (see `scratch_buffer`).
    """

    def __init__(self, device: Any = None) -> None:
        self.device = device if device is not None else default_device()
        self._calls: list[RecordedCall] = []

    def kernel(
        self,
        op: Any,
        inputs: Mapping[str, TensorIn | None],
        attrs: Mapping[str, float] | None = None,
        *,
        outputs: abc.Sequence[str] | None = None,
        out: Mapping[str, Tensor] | None = None,
        variant: str | None = None,
        tunables: Mapping[str, int] | None = None,
    ) -> dict[str, Tensor]:
        contract = getattr(op, "CONTRACT", op)
        if not isinstance(contract, OpContract):
            raise TypeError(f"Sequence.kernel() takes an op module (generated.group_normalization), not {type(op).__name__}")
        values, names, device, plan = _call_plan(contract, inputs, attrs, outputs, self.device, variant, None, tunables)
        wanted = _requested_outputs(contract, outputs)
        keyed_out, out_names = _output_names(contract, out)
        try:
            values, checked_out, _, _ = check_call(plan, values, device, keyed_out, {**names, **out_names}, "Sequence.kernel()")
        except ContractError as error:
            raise _in_callers_words(contract, error, names) from None
        tensors, _ = _call_tensors(plan, values, device, checked_out)
        call = record_call(plan, tensors, device)
        if call.bound:
            self._calls.append(call)
        return {o: tensors["output"][o] for o in wanted}

    def __len__(self) -> int:
        return len(self._calls)

    def run(self) -> None:
        """Encode every recorded call into one command buffer and submit it."""
        if not self._calls:
            return
        encoder = self.device.create_command_encoder(label="Sequence")
        encode_calls(encoder, self._calls, label="Sequence")
        self.device.queue.submit([encoder.finish()])
