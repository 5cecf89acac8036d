"""Device-side test helpers: calls with poisoned outputs, and facts the adapter does not report."""

from __future__ import annotations

import numpy as np

from generated._runtime import Tensor, default_device


def is_lavapipe() -> bool:
    return "llvmpipe" in str(default_device().adapter.info.get("device", ""))


def measured_subgroup_size() -> int:
    """The subgroup_size builtin as the default device gives it to a 1-D, 64-wide compute shader
    (the doctor's probe shader).

    Only a guide for other pipelines: with Mesa's shader cache on, a pipeline may run a binary
    compiled earlier at another LP_NATIVE_VECTOR_WIDTH.
    """
    from generated.doctor import measured_subgroup_width

    sizes = measured_subgroup_width(default_device())
    assert sizes is not None and len(sizes) == 1, f"subgroup sizes {sizes}"
    return sizes[0]


def poisoned_call(package, inputs, outputs=None, **kwargs):
    """package.kernel() writing into NaN-filled outputs, so an element a shader skips cannot pass.

    The outputs' shapes and dtypes are the plan's (most are the first input's; the layer family's
    statistics are float32 with the normalized axes kept as 1, RMS's Y has scale's type).
    """
    outputs = tuple(outputs or (package.OUTPUTS[0].key,))
    type_vars = {spec.key: spec.type_var for spec in package.INPUTS}
    dtypes = {type_vars[key]: np.dtype(value.dtype).name for key, value in inputs.items()}
    shapes = {key: value.shape for key, value in inputs.items()}
    planned = {
        k: kwargs[k] for k in ("attrs", "variant", "tunables", "device", "caps") if kwargs.get(k) is not None
    }
    if "device" not in planned and "caps" not in planned:
        planned["device"] = default_device()
    plan = package.plan(shapes, dtypes, outputs=outputs, **planned)
    out = {
        key: Tensor.from_numpy(np.full(shape, np.nan, dtype)) for key, (shape, dtype) in plan.outputs.items()
    }
    result = package.kernel(inputs, outputs=outputs, out=out, **kwargs)
    assert set(result) == set(outputs)
    for key in outputs:
        shape, dtype = plan.outputs[key]
        assert result[key].shape == tuple(shape) and result[key].dtype == np.dtype(dtype), key
    return result
