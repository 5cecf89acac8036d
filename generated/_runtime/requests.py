# SPDX-License-Identifier: Apache-2.0
"""A call's arguments checked and made into a Request: shapes, dtypes, attributes, tunables and
outputs, each refused by the caller's name for it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np

from .errors import ContractError
from .numeric import _storage_nbytes
from .plans import Request, WGSL_DTYPES
from .tensors import checked_shape


_DTYPE_NAMES = {
    "f32": "float32",
    "f16": "float16",
    "float32": "float32",
    "float16": "float16",
    np.dtype("float32"): "float32",
    np.dtype("float16"): "float16",
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


def checked_flag(op, name, value):
    """A plain function's flag argument (return_sum=): True or False, nothing that merely converts."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ContractError(op, f"argument {name}", "a bool", f"{name}= takes True or False, got {value!r}")


def _attribute_value(op, name, spec, value):
    """One attribute value checked against its kind and the 32-bit type the kernels give it."""
    subject = f"attribute {name}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ContractError(op, subject, spec.kind, f"expected a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond float's range: beyond both 32-bit types too
        kind = "32-bit int" if spec.kind == "int" else "f32 range"
        raise ContractError(
            op, subject, kind, f"{value!r} does not fit the 32-bit type the kernels use"
        ) from None
    if not finite:
        raise ContractError(op, subject, "finite", f"must be a finite number, got {value!r}")
    if spec.kind == "int":
        if not float(value).is_integer():
            raise ContractError(op, subject, "int", f"expected an integer, got {value!r}")
        value = int(value)
        if not -(2**31) <= value < 2**31:
            raise ContractError(
                op, subject, "32-bit int", f"{value} does not fit the 32-bit integer the kernels use"
            )
        return value
    value = float(value)
    if abs(value) > _F32_MAX:
        raise ContractError(
            op, subject, "f32 range", f"{value!r} does not fit a 32-bit float (the kernels compute in f32)"
        )
    if 0 < abs(value) < _F32_TINY:
        raise ContractError(
            op,
            subject,
            "f32 range",
            f"{value!r} is below the smallest normal 32-bit float and would act as 0",
        )
    return value


def _attributes(contract, attrs):
    if attrs is not None and not isinstance(attrs, Mapping):
        raise ContractError(
            contract.op,
            "attrs",
            "a mapping",
            f"attrs maps attribute names to values, got {type(attrs).__name__}",
        )
    attrs = dict(attrs or {})
    known = {a.name: a for a in contract.attributes}
    named = [name for name in attrs if not isinstance(name, str)]
    if named:
        raise ContractError(
            contract.op, "attrs", "attribute names", f"attribute names are strings, got {named[0]!r}"
        )
    unknown = sorted(set(attrs) - set(known))
    if unknown:
        raise ContractError(
            contract.op,
            f"attribute {unknown[0]}",
            "known attribute",
            f"unknown attribute{_suggest(unknown[0], known)}; known: {', '.join(known)}",
        )
    resolved = {}
    for name, spec in known.items():
        if name not in attrs:
            if spec.default is None:
                if spec.required:
                    raise ContractError(
                        contract.op,
                        f"attribute {name}",
                        "required",
                        "the attribute is required and has no default",
                    )
                continue
            resolved[name] = spec.default
            continue
        value = _attribute_value(contract.op, name, spec, attrs[name])
        if spec.allowed is not None:
            same = np.float32 if spec.comparison == "float32" else (lambda v: v)
            if not any(same(value) == same(a) for a in spec.allowed):
                allowed = ", ".join(repr(a) for a in spec.allowed)
                raise ContractError(
                    contract.op,
                    f"attribute {name}",
                    f"one of {allowed}",
                    f"{value!r} is not supported (allowed: {allowed})",
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
        raise ContractError(
            contract.op,
            "outputs",
            "output names",
            f"outputs= takes output names, like ('Y', 'S'); got {outputs!r}",
        )
    if not outputs:
        raise ContractError(
            contract.op,
            "outputs",
            "an output",
            "outputs= names at least one output (None: the required ones)",
        )
    unknown = [o for o in outputs if o not in by_name]
    if unknown:
        raise ContractError(
            contract.op,
            f"output {unknown[0]}",
            "known output",
            f"unknown output; outputs are {', '.join(t.role for t in contract.outputs)}",
        )
    return tuple(dict.fromkeys(by_name[o] for o in outputs))


def _given_shapes(contract, shapes):
    """{bind key: shape} and {bind key: the caller's name} from shapes keyed by key or role."""
    if not isinstance(shapes, Mapping):
        raise ContractError(
            contract.op,
            "shapes",
            "a mapping",
            f"shapes maps input names to shapes, got {type(shapes).__name__}",
        )
    given, names = _inputs_by_key(contract, shapes, _input_shape)
    for t in contract.inputs:
        if not t.optional and t.key not in given:
            name = names.get(t.key, t.key)
            alias = f" (ONNX name {t.role})" if t.role != name else ""
            raise ContractError(
                contract.op, f"input {name}", "required input", f"required input {name} is missing{alias}"
            )
    return given, names


def _inputs_by_key(contract, given, convert):
    """{bind key: convert(op, name, value)} and {bind key: the caller's name} of inputs named by bind
    key or ONNX role; a None value is an input left out (None shape: not given). An unknown name and
    an input given twice are refused."""
    tensors = {t.key: t for t in contract.inputs}
    roles = {t.role: t.key for t in contract.inputs}
    values, names = {}, {}
    for name, value in given.items():
        key = name if name in tensors else roles.get(name)
        if key is None:
            known = list(tensors) + [r for r in roles if r not in tensors]
            raise ContractError(
                contract.op,
                f"input {name}",
                "known input",
                f"unknown input{_suggest(name, known)}; inputs are {', '.join(tensors)}",
            )
        if key in names:
            raise ContractError(
                contract.op,
                f"input {name}",
                "one name per input",
                f"given twice, as {names[key]!r} and {name!r}: pass it once",
            )
        names[key] = name
        if value is not None:
            values[key] = convert(contract.op, name, value)
    return values, names


def _input_shape(op, name, shape):
    return checked_shape(op, f"input {name}", shape)


def _request_dtypes(contract, dtypes):
    if dtypes is not None and not isinstance(dtypes, Mapping):
        raise ContractError(
            contract.op,
            "dtypes",
            "a mapping",
            f"dtypes maps type variables to dtypes, got {type(dtypes).__name__}",
        )
    wgsl_dtypes = {}
    for type_var, value in (dtypes or {}).items():
        name = _dtype_name(value)
        allowed = contract.type_constraints.get(type_var)
        if allowed is None:
            raise ContractError(
                contract.op,
                f"dtype {type_var}",
                "known type variable",
                f"unknown type variable; known: {', '.join(contract.type_constraints)}",
            )
        if name not in allowed:
            raise ContractError(
                contract.op, f"dtype {type_var}", f"one of {', '.join(allowed)}", f"{name} is not supported"
            )
        wgsl_dtypes[type_var] = WGSL_DTYPES[name]
    for type_var, allowed in contract.type_constraints.items():
        if type_var not in wgsl_dtypes and len(allowed) == 1:
            # A variable of one type (an output's float32 statistics) needs no dtype from the caller.
            wgsl_dtypes[type_var] = WGSL_DTYPES[allowed[0]]
        if type_var not in wgsl_dtypes:
            raise ContractError(
                contract.op, f"dtype {type_var}", "given", "pass dtypes={...} for every type variable"
            )
    return wgsl_dtypes


def _checked_tunables(contract, tunables):
    if tunables is not None and not isinstance(tunables, Mapping):
        raise ContractError(
            contract.op,
            "tunables",
            "a mapping",
            f"tunables maps names to numbers, got {type(tunables).__name__}",
        )
    unknown_tunables = sorted(set(tunables or {}) - set(contract.tunables))
    if unknown_tunables:
        raise ContractError(
            contract.op,
            f"tunable {unknown_tunables[0]}",
            "known tunable",
            f"known: {', '.join(contract.tunables)}",
        )
    for name, value in (tunables or {}).items():
        # Workgroup sizes, counts and thresholds: some divide, so 0 is refused with the rest.
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and float(value).is_integer() and 1 <= value < 2**31):
            raise ContractError(
                contract.op, f"tunable {name}", "a whole number from 1 to 2**31 - 1", f"got {value!r}"
            )
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
    return Request(
        {**given, **output_shapes}, request.dtypes, request.attrs, request.tunables, caps, requested, names
    )


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
    return {
        k: {"f32": "float32", "f16": "float16"}[request.dtypes[spec_of[k].type_var]] for k in request.shapes
    }


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
