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
