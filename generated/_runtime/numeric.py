# SPDX-License-Identifier: Apache-2.0
"""Numbers as manifest expressions compute them (JavaScript semantics: manifest expressions are JS
Jinja), shape helpers, and the checks that turn a plan value into a WGSL u32, i32 or f32.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import DimensionError, PlanError


def js_div(a, b):
    """``a / b`` as JavaScript computes it: true division, and no error for a zero divisor. An exact
    quotient of two ints is an int (the same number; the manifest's int-typed values stay ints)."""
    if type(a) is int and type(b) is int and b != 0 and a % b == 0:
        return a // b
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


def bucket_up(x, buckets):
    """``bucketUp(x, buckets)``: the smallest of the ascending `buckets` that is >= x; the last for
    an x above them all (or NaN), so that a derived value never fails: the manifest's `when` says
    whether x fits its bucket (`x <= bucketUp(x, ...)`)."""
    for bucket in buckets:
        if x <= bucket:
            return bucket
    return buckets[-1]


def bucket_down(x, buckets):
    """``bucketDown(x, buckets)``: the largest of the ascending `buckets` that is <= x; the first
    for an x below them all (or NaN)."""
    for bucket in reversed(buckets):
        if x >= bucket:
            return bucket
    return buckets[0]


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


def reduced_shape(shape, axis):
    """The shape of a reduction over the axes from `axis` (negative counts from the end) to the last,
    the reduced axes kept as 1 (ONNX `keepdims`): LayerNormalization's Mean and InvStdDev."""
    j = _axis(shape, axis)
    return tuple(shape[:j]) + (1,) * (len(shape) - min(j, len(shape)))


def broadcast_stride(part, whole):
    """Where shape `part` broadcasts unidirectionally to `whole` (ONNX: right-aligned, each of its
    dims 1 or equal) along one run of axes (no axis it broadcasts along, a 1 against a dim over 1,
    lies between two of its dims over 1), flat element i of `whole` reads element
    (i // stride) % numel(part) of `part`: the stride, the product of `whole`'s dims right of
    `part`'s last dim over 1 (1 when it has none). 0 when `part` does not broadcast to `whole` or
    broadcasts along an axis inside its run."""
    offset = len(whole) - len(part)
    if offset < 0 or any(p not in (1, w) for p, w in zip(part, whole[offset:])):
        return 0
    varying = [offset + i for i, p in enumerate(part) if p != 1]
    if not varying:
        return 1
    inside = range(varying[0] + 1, varying[-1])
    if any(part[a - offset] == 1 and whole[a] != 1 for a in inside):
        return 0
    return math.prod(whole[varying[-1] + 1 :])


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


def i32(value, what):
    v = whole(value, what)
    if not -(2**31) <= v < 2**31:
        raise PlanError("plan", what, "i32 range", f"expected -2**31 <= value < 2**31, got {v}")
    return v


_ITEMSIZE = {"float32": 4, "float16": 2}


def storage_nbytes(shape, dtype_name):
    """Bytes of a tensor's buffer: copies and reads need multiples of 4, and never 0."""
    itemsize = _ITEMSIZE.get(dtype_name) or np.dtype(dtype_name).itemsize
    nbytes = math.prod(shape) * itemsize
    return max(4, -(-nbytes // 4) * 4)


def f32(value, what):
    """value as a float that a WGSL f32 holds: finite and within the f32 range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PlanError("plan", what, "finite f32", f"expected a number, got {value!r}")
    x = float(value)
    if not (math.isfinite(x) and abs(x) <= 3.4028234663852886e38):
        raise PlanError("plan", what, "finite f32", f"expected a finite 32-bit float, got {value!r}")
    return x
