"""Device-side test helpers: calls with poisoned outputs, and facts the adapter does not report."""

from __future__ import annotations

import numpy as np

from generated._runtime import Tensor, default_device

PROBE = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(subgroup_size) size: u32, @builtin(local_invocation_index) i: u32) { out[i] = size; }
"""


def is_lavapipe() -> bool:
    return "llvmpipe" in str(default_device().adapter.info.get("device", ""))


def measured_subgroup_size() -> int:
    """The subgroup_size builtin as the default device gives it to a 1-D, 64-wide compute shader.

    Only a guide for other pipelines: with Mesa's shader cache on, a pipeline may run a binary
    compiled earlier at another LP_NATIVE_VECTOR_WIDTH.
    """
    import wgpu

    device = default_device()
    module = device.create_shader_module(code=PROBE)
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    buffer = device.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    bind_group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buffer}}]
    )
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, bind_group)
    compute.dispatch_workgroups(1)
    compute.end()
    device.queue.submit([encoder.finish()])
    sizes = set(np.frombuffer(device.queue.read_buffer(buffer), np.uint32).tolist())
    assert len(sizes) == 1, f"subgroup sizes {sizes}"
    return sizes.pop()


def poisoned_call(package, inputs, outputs=None, **kwargs):
    """package.kernel() writing into NaN-filled outputs, so an element a shader skips cannot pass.

    Every output of these ops has the first input's shape and dtype.
    """
    first = next(iter(inputs.values()))
    outputs = tuple(outputs or (package.OUTPUTS[0].key,))
    out = {key: Tensor.from_numpy(np.full(first.shape, np.nan, first.dtype)) for key in outputs}
    result = package.kernel(inputs, outputs=outputs, out=out, **kwargs)
    assert set(result) == set(outputs)
    for key in outputs:
        assert result[key].shape == first.shape and result[key].dtype == first.dtype, key
    return result
