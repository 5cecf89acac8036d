# SPDX-License-Identifier: Apache-2.0
"""Run-time support for the generated kernel package, one module per concern.

Hand-written, like every module of the package that is not under a "Generated" banner. It imports
only the standard library, numpy and (lazily, inside the functions that touch a GPU) wgpu, so that
importing a generated op and making plans stays cheap and GPU-free. Its modules import each other
relatively, so a copy of the generated package under another name works as it is.

The modules, each importing only those above it:

- ``errors``: ContractError, PlanError, DimensionError
- ``cache``: LRUCache, per-device caches, entries that go with the buffers they bind
- ``numeric``: JavaScript number semantics, shape helpers, u32 / i32 / f32 checks
- ``caps``: Caps, WebGPU's limits and features, a device's snapshot, the default device
- ``limits``: folded dispatches and the device limits a plan must fit
- ``plans``: contract and plan data (OpContract, Request, Plan, PassPlan, ...), make_pass
- ``select``: variant selection
- ``tensors``: Tensor, TensorIn and the checks of a Tensor
- ``pipelines``: shader modules, layouts, pipelines, uniform buffers, bind groups, scratch
- ``requests``: a call's arguments checked and made into a Request
- ``chunking``: a request over one storage binding cut into pieces
- ``planning``: plans from requests, the plan cache, plan() / explain()
- ``calls``: checking, recording, encoding and running a plan
- ``kernel``: kernel(), warmup(), the package's warmup(), Sequence

This module re-exports what the generated op modules, the package's tools and the tests use. The
caches are re-exported as the objects themselves (a test may shrink ``_plans.maxsize``); a count
that changes is read through a function (``pipelines_created()``), never as a module-level int,
which an import would copy. Names with a leading underscore are the package's own.
"""

from __future__ import annotations

from .errors import ContractError, PlanError, DimensionError, NoAdapterError, DeviceLostError
from .cache import LRUCache, _per_device
from .numeric import (
    js_div,
    js_mod,
    js_str,
    pow2ceil,
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
from .caps import (
    WEBGPU_DEFAULT_LIMITS,
    WEBGPU_FEATURES,
    Caps,
    features_text,
    _caps_by_device,
    device_caps,
    caps_of,
    checked_device,
    default_device,
)
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
from .requests import checked_flag
from .tensors import checked_shape, tensor_dtype, Tensor, TensorIn, check_tensor_buffer, check_encoder
from .pipelines import (
    PIPELINE_CACHE_SIZE,
    UNIFORM_CACHE_SIZE,
    _shader_modules,
    _bind_group_layouts,
    _pipelines,
    _uniform_buffers,
    pipelines_created,
    _pipeline,
    warm_pipelines,
    BoundPass,
    BufferSlice,
    whole_tensor,
    bind_passes,
    bind_group_entries,
    BIND_GROUP_CACHE_SIZE,
    _bind_groups,
    encode_passes,
    SCRATCH_POOL_SIZE,
    _scratch,
    scratch_buffer,
)
from .chunking import chunk_request
from .planning import _plans, _caps_by_mapping, planning_caps, build_plan, explain_plan
from .calls import (
    run_plan,
    check_call,
    _plans_fit,
    _intermediates,
    BufferCopy,
    RecordedCall,
    record_call,
    encode_calls,
)
from .kernel import (
    run_kernel,
    REPEATED_CALLS_SIZE,
    _repeated_calls,
    RepeatedCall,
    warm_up,
    warm_cases,
    Sequence,
)

__all__ = [
    "ContractError",
    "PlanError",
    "DimensionError",
    "NoAdapterError",
    "DeviceLostError",
    "LRUCache",
    "_per_device",
    "js_div",
    "js_mod",
    "js_str",
    "pow2ceil",
    "ceil_div",
    "numel",
    "dim",
    "inner",
    "outer",
    "reduced_shape",
    "broadcast_stride",
    "onnx_dtype_code",
    "show",
    "checked_flag",
    "whole",
    "u32",
    "WEBGPU_DEFAULT_LIMITS",
    "WEBGPU_FEATURES",
    "Caps",
    "features_text",
    "_caps_by_device",
    "device_caps",
    "caps_of",
    "checked_device",
    "default_device",
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
    "UNIFORM_CACHE_SIZE",
    "_shader_modules",
    "_bind_group_layouts",
    "_pipelines",
    "_uniform_buffers",
    "pipelines_created",
    "_pipeline",
    "warm_pipelines",
    "BoundPass",
    "BufferSlice",
    "whole_tensor",
    "bind_passes",
    "bind_group_entries",
    "BIND_GROUP_CACHE_SIZE",
    "_bind_groups",
    "encode_passes",
    "SCRATCH_POOL_SIZE",
    "_scratch",
    "scratch_buffer",
    "chunk_request",
    "_plans",
    "_caps_by_mapping",
    "planning_caps",
    "build_plan",
    "explain_plan",
    "run_plan",
    "check_call",
    "_plans_fit",
    "_intermediates",
    "BufferCopy",
    "RecordedCall",
    "record_call",
    "encode_calls",
    "run_kernel",
    "REPEATED_CALLS_SIZE",
    "_repeated_calls",
    "RepeatedCall",
    "warm_up",
    "warm_cases",
    "Sequence",
]
