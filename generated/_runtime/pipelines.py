# SPDX-License-Identifier: Apache-2.0
"""GPU objects cached per device: shader modules, bind group layouts and pipelines (with the count of
those created), uniform buffers, bind groups and the scratch pool; `encode_passes`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from .cache import per_device, watching
from .numeric import i32, u32
from .plans import pack_uniforms
from .tensors import Tensor


def _override_constants(pass_plan):
    return _override_constants_of(pass_plan.overrides, pass_plan.override_types)


def _override_constants_of(overrides, override_types):
    constants = {}
    for name, value in overrides.items():
        typ = override_types.get(name, "f32")
        if typ == "u32":
            constants[name] = u32(value, f"override {name}")
        elif typ == "i32":
            constants[name] = i32(value, f"override {name}")
        else:
            constants[name] = float(value)
    return constants


# Per-device caches, each bounded: weak keys so that a caller's device and its pipelines go away
# together, and LRU eviction so that an app with changing shapes keeps a bounded set alive.
# Evicted objects are dropped, never destroyed: work already submitted keeps what it uses alive.
PIPELINE_CACHE_SIZE = 1024  # every pipeline the shipped cases reach on one device is about 320
UNIFORM_CACHE_SIZE = 1024
shader_module_cache = weakref.WeakKeyDictionary()  # device -> LRUCache {wgsl: module}
bind_group_layout_cache = weakref.WeakKeyDictionary()  # device -> LRUCache {layout key: layout}
pipeline_cache = (
    weakref.WeakKeyDictionary()
)  # device -> LRUCache {(wgsl, overrides, layout key): (pipeline, layout)}
uniform_buffer_cache = weakref.WeakKeyDictionary()  # device -> LRUCache {packed bytes: buffer}
_pipelines_created = 0  # read through pipelines_created(): an int imported elsewhere is a copy


def pipelines_created():
    """How many compute pipelines this process has created (warm-up and tests read it).

    A function, not a module-level int, so that a name imported from the package reads the count now.
    """
    return _pipelines_created


def _layout_key(pass_plan):
    return tuple((b.index, b.buffer) for b in pass_plan.bindings)


def _bind_group_layout(device, key):
    import wgpu

    cache = per_device(bind_group_layout_cache, device, PIPELINE_CACHE_SIZE)
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
    modules = per_device(shader_module_cache, device, PIPELINE_CACHE_SIZE)
    module = modules.get(pass_plan.wgsl)
    if module is None:
        module = device.create_shader_module(label=pass_plan.label, code=pass_plan.wgsl)
        modules.put(pass_plan.wgsl, module)
    return module


def pipeline_for(device, pass_plan):
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
    return per_device(pipeline_cache, device, PIPELINE_CACHE_SIZE).get(_pipeline_key(pass_plan))


def _start_pipeline(device, pass_plan):
    """Begin creating a pass's pipeline with wgpu's asynchronous call (synchronous in wgpu-native
    0.32, which has no asynchronous pipeline creation yet: the promise is then already resolved)."""
    # An explicit layout from the plan's bindings: layout="auto" drops bindings the shader
    # does not use, and a bind group holding them is then refused.
    bind_group_layout = _bind_group_layout(device, _layout_key(pass_plan))
    promise = device.create_compute_pipeline_async(
        label=pass_plan.label,
        layout=device.create_pipeline_layout(bind_group_layouts=[bind_group_layout]),
        compute={
            "module": _shader_module(device, pass_plan),
            "entry_point": "main",
            "constants": dict(_pipeline_key(pass_plan)[1]),
        },
    )
    return promise, bind_group_layout


def _finish_pipeline(device, pass_plan, pipeline, bind_group_layout):
    global _pipelines_created
    _pipelines_created += 1
    cached = (pipeline, bind_group_layout)
    per_device(pipeline_cache, device, PIPELINE_CACHE_SIZE).put(_pipeline_key(pass_plan), cached)
    return cached


def warm_pipelines(device, passes):
    """Create every missing pipeline of `passes`: all requests first, then the waits."""
    started = []
    for pass_plan in passes:
        if _cached_pipeline(device, pass_plan) is None and _pipeline_key(pass_plan) not in {
            _pipeline_key(p) for p, _, _ in started
        }:
            started.append((pass_plan, *_start_pipeline(device, pass_plan)))
    for pass_plan, promise, bind_group_layout in started:
        _finish_pipeline(device, pass_plan, promise.sync_wait(), bind_group_layout)
    return len(started)


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
    buffers = per_device(uniform_buffer_cache, device, UNIFORM_CACHE_SIZE)
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
        pipeline, bind_group_layout = pipeline_for(device, pass_plan)
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
            view = tensors[b.kind].get(b.resource)
            if view is None:  # a manifest defect: a binding of an optional tensor needs a `when`
                raise RuntimeError(
                    f"pass {pass_plan.name} binds {b.kind} {b.resource!r}, which this call does not have"
                )
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
bind_group_cache = (
    weakref.WeakKeyDictionary()
)  # device -> LRUCache {(layout, views): (bind group, weak refs)}


def _bind_group(device, layout, entries):
    """A bind group per (layout, buffer ranges), cached: a repeated call on the same Tensors
    builds nothing. The key holds ids, so a hit is checked against weak references to the layout
    and the buffers it was made with: a buffer that died and left its id to another never matches."""
    key = (id(layout), tuple((index, id(v.buffer), v.offset, v.size) for index, v in entries))
    cache = per_device(bind_group_cache, device, BIND_GROUP_CACHE_SIZE)
    hit = cache.get(key)
    if hit is not None:
        bind_group, refs = hit
        if refs[0]() is layout and all(ref() is v.buffer for ref, (_, v) in zip(refs[1:], entries)):
            return bind_group
    bind_group = device.create_bind_group(
        layout=layout,
        entries=[
            {"binding": index, "resource": {"buffer": v.buffer, "offset": v.offset, "size": v.size}}
            for index, v in entries
        ],
    )
    entry = [bind_group, None]
    entry[1] = (weakref.ref(layout),) + watching(cache, key, entry, [v.buffer for _, v in entries])
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
        writes = {
            "query_set": query_set,
            "beginning_of_pass_write_index": begin,
            "end_of_pass_write_index": end,
        }
    compute = encoder.begin_compute_pass(label=label, timestamp_writes=writes)
    for item in bound:
        compute.push_debug_group(item.label)
        compute.set_pipeline(item.pipeline)
        compute.set_bind_group(0, item.bind_group)
        compute.dispatch_workgroups(*item.dispatch)
        compute.pop_debug_group()
    compute.end()


# Scratch (intermediates, and the (C) ranges a piece copies) comes from one pool per device, reused
# by every call. That is safe because WebGPU runs the commands of a queue in order, and makes each
# dispatch, copy and pass see everything the commands before it wrote: whether two calls share an
# encoder, a submission or neither, the later one's use of a scratch buffer starts after the earlier
# one's ended. Pooled buffers are never destroyed, only dropped when the pool forgets them, so an
# encoder recorded but not yet submitted keeps what it uses alive.
SCRATCH_POOL_SIZE = 256
scratch_pool = weakref.WeakKeyDictionary()  # device -> LRUCache {(role, nbytes): buffer}


def scratch_buffer(device, role, nbytes):
    """A pooled storage buffer of `nbytes` for `role` (distinct roles never share one)."""
    import wgpu

    pool = per_device(scratch_pool, device, SCRATCH_POOL_SIZE)
    key = (role, nbytes)
    buffer = pool.get(key)
    if buffer is None:
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        buffer = device.create_buffer(size=max(4, nbytes), usage=usage)
        pool.put(key, buffer)
    return buffer
