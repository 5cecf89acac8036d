# SPDX-License-Identifier: Apache-2.0
"""Run-time support for the generated kernel package, one module per concern.

Hand-written, like every module of the package that is not under a "Generated" banner. It imports
only the standard library, numpy and (lazily, inside the functions that touch a GPU) wgpu, so that
importing a generated op and making plans stays cheap and GPU-free. Its modules import each other
relatively, so a copy of the generated package under another name works as it is.

The modules, each importing only those above it (no cycle), and only their public names (a name
two modules share is public inside the package; tests/runtime/test_runtime_imports.py checks both):

- ``errors``: ContractError, PlanError, DimensionError, NoAdapterError, DeviceLostError
- ``cache``: LRUCache, per-device caches, entries that go with the buffers they bind
- ``numeric``: JavaScript number semantics, shape helpers, u32 / i32 / f32 checks, buffer sizes
- ``buffer_watch``: buffers destroyed behind the runtime's back, the lock of every call and the
  call scope (what a destroy() or a Tensor's end during a call waits for)
- ``allocator``: the caching allocator, a pool of buffers in size classes per device
- ``caps``: Caps, WebGPU's limits and features, a device's snapshot, the default device
- ``transfers``: uploads from an array's own memory, read-backs through pooled staging buffers
- ``limits``: folded dispatches and the device limits a plan must fit
- ``plans``: contract and plan data (OpContract, Request, Plan, PassPlan, ...), make_pass
- ``select``: variant selection
- ``tensors``: Tensor, TensorIn and the checks of a Tensor
- ``pipelines``: shader modules, layouts, pipelines, uniform buffers, bind groups, scratch
- ``chunking``: a request over one storage binding cut into pieces
- ``planning``: plans from requests
- ``calls``: checking, recording, encoding and running a plan
- ``boundary``: a call's arguments made into a Request once (in the caller's names), the plan
  cache, plan() / explain()
- ``kernel``: kernel() (and its memo of repeated calls), Sequence
- ``warmup``: an op's warmup() of one request or of ranges and lists of them, the package's warmup()
  (cases and sweeps, in a thread of its own if asked)
- ``memory``: memory_stats(), empty_cache(), set_cache_limit(), set_pipeline_cache_limit()

This module re-exports what the generated op modules, the package's tools and the tests use. The
caches are re-exported as the objects themselves (a test may shrink ``plan_cache.maxsize``); a
count that changes is read through a function (``pipelines_created()``), never as a module-level
int, which an import would copy.
"""

from __future__ import annotations

from .errors import ContractError, PlanError, DimensionError, NoAdapterError, DeviceLostError
from .cache import LRUCache, per_device
from .numeric import (
    js_div,
    js_mod,
    js_str,
    pow2ceil,
    bucket_up,
    bucket_down,
    ceil_div,
    numel,
    dim,
    inner,
    outer,
    reduced_shape,
    broadcast_stride,
    onnx_dtype_code,
    show,
    whole,
    u32,
)
from .allocator import DEFAULT_CACHE_LIMIT, BufferPool, MemoryStats, pool_of, size_class
from .caps import (
    WEBGPU_DEFAULT_LIMITS,
    WEBGPU_FEATURES,
    Caps,
    features_text,
    device_caps,
    caps_of,
    checked_device,
    default_device,
)
from .transfers import ReadBack, upload
from .limits import (
    fold_width,
    fold_dispatch,
    threads_dispatch,
    WORKGROUP_LIMITS,
    check_pass_limits,
    check_binding_sizes,
    check_plan_fits,
    check_shader_features,
    check_chunk_offsets,
)
from .plans import (
    Request,
    Binding,
    PassPlan,
    Plan,
    pack_uniforms,
    WGSL_DTYPES,
    TensorSpec,
    AttributeSpec,
    Shader,
    ShaderInterface,
    shader_table,
    shader_text,
    OpContract,
    make_pass,
    ChunkSpec,
    Chunk,
)
from .select import candidate_verdict, select
from .tensors import checked_shape, tensor_dtype, Tensor, TensorIn, check_tensor_buffer, check_encoder
from .pipelines import (
    PIPELINE_CACHE_SIZE,
    PIPELINE_CACHE_BYTES,
    MIN_PIPELINE_BYTES,
    UNIFORM_CACHE_SIZE,
    shader_module_cache,
    bind_group_layout_cache,
    pipeline_cache,
    uniform_buffer_cache,
    pipelines_created,
    pipelines_of,
    pipeline_for,
    warm_pipelines,
    BoundPass,
    BufferSlice,
    whole_tensor,
    bind_passes,
    bind_group_entries,
    BIND_GROUP_CACHE_SIZE,
    bind_group_cache,
    encode_passes,
    SCRATCH_POOL_SIZE,
    scratch_pool,
    scratch_buffer,
)
from .chunking import chunk_request
from .planning import plan_request
from .calls import (
    run_plan,
    check_call,
    intermediate_views,
    BufferCopy,
    RecordedCall,
    record_call,
    encode_calls,
)
from .boundary import (
    checked_flag,
    plan_uncached,
    PLAN_CACHE_SIZE,
    plan_cache,
    planning_caps,
    build_plan,
    explain_plan,
)
from .kernel import (
    run_kernel,
    REPEATED_CALLS_SIZE,
    repeated_call_cache,
    RepeatedCall,
    Sequence,
)
from .warmup import warm_up, warm_cases, WarmupReport, WarmupTask, MAX_WARMUP_REQUESTS
from .memory import memory_stats, empty_cache, set_cache_limit, set_pipeline_cache_limit

__all__ = [
    "ContractError",
    "PlanError",
    "DimensionError",
    "NoAdapterError",
    "DeviceLostError",
    "LRUCache",
    "per_device",
    "js_div",
    "js_mod",
    "js_str",
    "pow2ceil",
    "bucket_up",
    "bucket_down",
    "ceil_div",
    "numel",
    "dim",
    "inner",
    "outer",
    "reduced_shape",
    "broadcast_stride",
    "onnx_dtype_code",
    "show",
    "whole",
    "u32",
    "WEBGPU_DEFAULT_LIMITS",
    "WEBGPU_FEATURES",
    "Caps",
    "features_text",
    "device_caps",
    "caps_of",
    "checked_device",
    "default_device",
    "DEFAULT_CACHE_LIMIT",
    "BufferPool",
    "MemoryStats",
    "pool_of",
    "size_class",
    "ReadBack",
    "upload",
    "fold_width",
    "fold_dispatch",
    "threads_dispatch",
    "WORKGROUP_LIMITS",
    "check_pass_limits",
    "check_binding_sizes",
    "check_plan_fits",
    "check_shader_features",
    "check_chunk_offsets",
    "Request",
    "Binding",
    "PassPlan",
    "Plan",
    "pack_uniforms",
    "WGSL_DTYPES",
    "TensorSpec",
    "AttributeSpec",
    "Shader",
    "ShaderInterface",
    "shader_table",
    "shader_text",
    "OpContract",
    "make_pass",
    "ChunkSpec",
    "Chunk",
    "candidate_verdict",
    "select",
    "checked_shape",
    "tensor_dtype",
    "Tensor",
    "TensorIn",
    "check_tensor_buffer",
    "check_encoder",
    "PIPELINE_CACHE_SIZE",
    "PIPELINE_CACHE_BYTES",
    "MIN_PIPELINE_BYTES",
    "UNIFORM_CACHE_SIZE",
    "shader_module_cache",
    "bind_group_layout_cache",
    "pipeline_cache",
    "uniform_buffer_cache",
    "pipelines_created",
    "pipelines_of",
    "pipeline_for",
    "warm_pipelines",
    "BoundPass",
    "BufferSlice",
    "whole_tensor",
    "bind_passes",
    "bind_group_entries",
    "BIND_GROUP_CACHE_SIZE",
    "bind_group_cache",
    "encode_passes",
    "SCRATCH_POOL_SIZE",
    "scratch_pool",
    "scratch_buffer",
    "chunk_request",
    "plan_request",
    "run_plan",
    "check_call",
    "intermediate_views",
    "BufferCopy",
    "RecordedCall",
    "record_call",
    "encode_calls",
    "checked_flag",
    "plan_uncached",
    "PLAN_CACHE_SIZE",
    "plan_cache",
    "planning_caps",
    "build_plan",
    "explain_plan",
    "run_kernel",
    "REPEATED_CALLS_SIZE",
    "repeated_call_cache",
    "RepeatedCall",
    "Sequence",
    "warm_up",
    "warm_cases",
    "WarmupReport",
    "WarmupTask",
    "MAX_WARMUP_REQUESTS",
    "memory_stats",
    "empty_cache",
    "set_cache_limit",
    "set_pipeline_cache_limit",
]
