# SPDX-License-Identifier: Apache-2.0
"""Device capabilities in WebGPU's names: the default limits and the feature names, `Caps`, the
snapshot of a wgpu device's, and the process's default device.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .buffer_watch import calls_lock, watch_buffers_of
from .errors import ContractError, DeviceLostError, NoAdapterError, PlanError
from .numeric import whole


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

    def __post_init__(self):
        # A Caps made directly or by dataclasses.replace (of a device_caps snapshot, say) gets the
        # checks of from_mapping but the names' (a snapshot holds native feature names): limits
        # known, whole and possible, left-out ones WebGPU's defaults; features sets of strings.
        given = {"limits": self.limits, "adapterInfo": self.adapter_info}
        object.__setattr__(self, "limits", _given_limits(given))
        object.__setattr__(self, "adapter_info", dict(_given_mapping(given, "adapterInfo")))
        for key, attribute in (("features", "features"), ("wgslLanguageFeatures", "wgsl_language_features")):
            object.__setattr__(self, attribute, frozenset(_given_names({key: getattr(self, attribute)}, key)))

    @classmethod
    def from_mapping(cls, m):
        """Caps from ``{"limits", "features", "wgslLanguageFeatures", "adapterInfo"}``.

        Every key is optional; a limit left out takes WebGPU's default value, so a plan can be
        made for a device one does not have. Names are WebGPU's (and wgpu-native's "subgroup",
        which ``device.features`` reports, is read as "subgroups"); an unknown one is refused,
        since a misspelt feature (``shader_f16``) would otherwise plan silently without it.
        """
        unknown_keys = [k for k in m if k not in _CAPS_KEYS]
        if unknown_keys:
            raise _caps_error("keys", f"unknown caps keys: {_names_text(unknown_keys)}", _CAPS_KEYS)
        features = [_WEBGPU_FEATURE_NAMES.get(f, f) for f in _given_names(m, "features")]
        unknown = sorted(set(features) - WEBGPU_FEATURES)
        if unknown:
            raise _caps_error("features", f"unknown WebGPU features: {', '.join(unknown)}", WEBGPU_FEATURES)
        return cls(  # __post_init__ checks the limits and the rest
            limits=_given_mapping(m, "limits"),
            features=frozenset(features),
            wgsl_language_features=frozenset(_given_names(m, "wgslLanguageFeatures")),
            adapter_info=_given_mapping(m, "adapterInfo"),
        )


_CAPS_KEYS = ("limits", "features", "wgslLanguageFeatures", "adapterInfo")


def _names_text(names):
    """Names as a message lists them: strings as they are, anything else as its repr."""
    return ", ".join(sorted(n if isinstance(n, str) else repr(n) for n in names))


def _given_mapping(m, key):
    """`m[key]` where it must be a mapping (limits, adapterInfo); {} when left out."""
    value = m.get(key, {})
    if not isinstance(value, Mapping):
        raise _caps_error(key, f"{key} must be a mapping, not {type(value).__name__}", ())
    return value


def _given_names(m, key):
    """`m[key]` where it must be a collection of names (features, wgslLanguageFeatures), read once."""
    value = m.get(key, ())
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        shown = f"the string {value!r}" if isinstance(value, (str, bytes)) else type(value).__name__
        raise _caps_error(key, f"{key} must be a list of names, not {shown}", ())
    names = tuple(value)  # an iterator is read once, here
    odd = [n for n in names if not isinstance(n, str)]
    if odd:
        raise _caps_error(key, f"{key} must be a list of names (strings), got {odd[0]!r}", ())
    return names


def _given_limits(m):
    """WebGPU's default limits with the given ones in their place, each a whole number >= 0."""
    given = _given_mapping(m, "limits")
    unknown = [name for name in given if name not in WEBGPU_DEFAULT_LIMITS]
    if unknown:
        raise _caps_error("limits", f"unknown WebGPU limits: {_names_text(unknown)}", WEBGPU_DEFAULT_LIMITS)
    limits = dict(WEBGPU_DEFAULT_LIMITS)
    for name, value in given.items():
        try:
            limit = whole(value, f"limits.{name}")
        except PlanError as error:
            raise _caps_error("limits", f"limits.{name}: {error.message}", ()) from None
        if limit < 0:
            raise _caps_error("limits", f"limits.{name} = {value!r} is negative", ())
        if name.endswith("Alignment") and (limit < 1 or limit & (limit - 1)):
            raise _caps_error("limits", f"limits.{name} = {value!r}: an alignment is a power of two", ())
        if name in _AT_LEAST_ONE and limit < 1:
            raise _caps_error("limits", f"limits.{name} = {value!r}: a device has at least 1", ())
        limits[name] = limit
    return limits


# Limits every WebGPU device has at least 1 of, and that plans divide by or dispatch against.
_AT_LEAST_ONE = frozenset(
    (
        "maxComputeWorkgroupsPerDimension",
        "maxComputeInvocationsPerWorkgroup",
        "maxComputeWorkgroupSizeX",
        "maxComputeWorkgroupSizeY",
        "maxComputeWorkgroupSizeZ",
    )
)


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
    raise ContractError(
        "caps",
        "caps",
        "a mapping",
        f"caps must be None, a Caps or a mapping of WebGPU facts, not {type(caps).__name__}",
    )


_device_classes: set = set()  # the GPUDevice classes seen, so that a check costs one set lookup


def checked_device(op, device):
    """`device=` as given: None (the caller's default) or a wgpu GPUDevice; anything else is refused
    by name before it reaches a per-device cache (a string cannot be weakly referenced) or wgpu."""
    if device is None or type(device) in _device_classes:
        return device
    import wgpu

    if isinstance(device, wgpu.GPUDevice):
        watch_buffers_of(device)
        _device_classes.add(type(device))
        return device
    hint = (
        ": pass adapter.request_device_sync()"
        if isinstance(device, wgpu.GPUAdapter)
        else " (generated.default_device(), or adapter.request_device_sync())"
    )
    raise ContractError(
        op, "device", "a GPUDevice", f"device= takes a wgpu GPUDevice, not {type(device).__name__}{hint}"
    )


_default_device = None
_default_device_lock = threading.RLock()  # re-entrant, as LRUCache's lock


def default_device() -> Any:
    """One shared wgpu device per process, with the adapter's limits and useful features."""
    global _default_device
    with _default_device_lock:
        if _default_device is None:
            import wgpu

            try:
                adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            except RuntimeError as error:  # wgpu 0.32 raises where older ones returned None
                lines = [line.strip() for line in str(error).splitlines() if line.strip()]
                raise NoAdapterError(lines[-1] if lines else type(error).__name__) from None
            if adapter is None:
                raise NoAdapterError("the request for an adapter returned none")
            wanted = (_NATIVE_FEATURE_NAMES.get(f, f) for f in _DEFAULT_DEVICE_FEATURES)
            _default_device = adapter.request_device_sync(
                required_features=[f for f in wanted if f in adapter.features],
                required_limits=adapter.limits,
            )
            watch_buffers_of(_default_device)
        return _default_device


# wgpu's validation error for any use of a destroyed or lost device ("Parent device is lost",
# wgpu-hal's "Device is lost"), compared in lower case.
_LOST_DEVICE_TEXT = "device is lost"


def _says_lost(error) -> bool:
    return type(error).__name__ == "GPUValidationError" and _LOST_DEVICE_TEXT in str(error).lower()


def _lost(device) -> bool:
    """Whether `device` is lost: a 4-byte buffer it cannot make says so (asked after an error, and by
    warmup, whose pipelines may all be cached)."""
    import wgpu

    try:  # (released when collected: a destroy() would count as a caller's buffer change)
        device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_DST)
    except Exception as error:
        return _says_lost(error)
    return False


def _forget_lost_default_device():
    global _default_device
    with _default_device_lock:
        if _default_device is not None and _lost(_default_device):
            _default_device = None


def refuse_lost_device(op, device):
    """DeviceLostError if `device` is lost, for calls that may do no GPU work of their own."""
    if _lost(device):
        _forget_lost_default_device()
        raise DeviceLostError(op)


def raise_if_device_lost(op, error):
    """Raise DeviceLostError where a wgpu error says the device is lost, instead of wgpu's
    validation error (naming the outermost call that found out); the process default device, if it
    is the lost one, is forgotten so that default_device() makes a new one. Any other error is the
    caller's to re-raise."""
    if isinstance(error, DeviceLostError):  # found by a call inside this one: name the caller's
        raise DeviceLostError(op) from error.__cause__
    if not _says_lost(error):
        return
    _forget_lost_default_device()
    raise DeviceLostError(op) from error


_Call = TypeVar("_Call", bound=Callable[..., Any])


def refusing_lost_device(op: str | Callable[..., str]) -> Callable[[_Call], _Call]:
    """Decorator for the entry points: the call runs under calls_lock, and what it raises because
    its device is lost becomes DeviceLostError naming `op` (a name, or a function of the call's
    arguments that gives it)."""

    def decorate(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            try:
                with calls_lock:
                    return function(*args, **kwargs)
            except Exception as error:
                raise_if_device_lost(op(*args) if callable(op) else op, error)
                raise

        return call

    return decorate
