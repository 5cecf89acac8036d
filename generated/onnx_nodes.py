# SPDX-License-Identifier: Apache-2.0
"""Run one ONNX node (an `onnx.NodeProto`) through the op package that implements it.

    from generated.onnx_nodes import run_node
    (y,) = run_node(node, [x, scale, bias], opset=21)

It imports the package only
relatively, and `onnx` only inside the functions that read attributes (values and types), so the
kernels keep needing only wgpu and numpy. Any object with `op_type` (a str), `domain`, `input`,
`output` and `attribute` (each attribute with `name` and an `onnx.AttributeProto` value) is a node
here; anything else (None, a str, a serialized node, a ModelProto) is a TypeError saying so.

The node's inputs and outputs are matched to the op's INPUTS and OUTPUTS by position, as ONNX
defines them; an empty name is an omitted optional input or an output not asked for. The node's
attributes must be those of the schema of its ONNX version (`onnx.defs`: GroupNormalization-18 has
no stash_type, BatchNormalization-9 no training_mode), each given once and of its schema's ONNX type
(INT or FLOAT); they are then passed as they are, and the op package's contract checks them (a value
it does not support is a `ContractError` naming it).

The opset is not bounded above: the registry serves an op's newest version at every later opset
(ONNX's own checker takes opset_import 10**6 too), so a far-future opset runs the newest version.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from . import _runtime, find_op, ops
from ._runtime import ContractError


class UnsupportedNodeError(ValueError):
    """No op package here runs this node (op type, domain or opset), or not the way it is written."""


class NodeCall(NamedTuple):
    """A node bound to an op package: what `kernel()` gets, and how results map back to the node."""

    entry: object  # the OpEntry of ops()
    inputs: dict  # bind key -> array or Tensor
    attrs: dict
    outputs: tuple  # bind keys of the outputs the node asks for
    output_names: tuple  # the node's output names, "" where it asks for none
    # bind key -> (shape, dtype) the node's output has where the call's differs (an adapted node:
    # BatchNormalization's rank-1 X runs as (N, 1), mixed float types in float32); None: none does.
    output_forms: dict | None = None

    @property
    def module(self):
        return self.entry.module


def _domain(node) -> str:
    return node.domain or "ai.onnx"


def _supported() -> str:
    return "; ".join(str(e) for e in ops().values())


def _node_name(node) -> str:
    return getattr(node, "name", "") or node.op_type


def _node_label(node) -> str:
    return f"{_domain(node)} {node.op_type} node {_node_name(node)!r}"


NODE_FIELDS = ("op_type", "domain", "input", "output", "attribute")


def _checked_node(node):
    """Refuse, as a TypeError naming what it takes, a `node` that is not a NodeProto (or an object like one)."""
    missing = [field for field in NODE_FIELDS if not hasattr(node, field)]
    if not missing and isinstance(node.op_type, str) and isinstance(node.domain or "", str):
        return
    what = type(node).__name__
    if isinstance(node, (bytes, bytearray)):
        what += " (a serialized node? parse it with onnx.NodeProto.FromString)"
    elif not missing:
        what += f" whose op_type is {node.op_type!r} and domain {node.domain!r}, not strings"
    raise TypeError(
        "node is an onnx NodeProto (or an object with op_type and domain strings, input, output and "
        f"attribute); got {what}"
    )


def _checked_opset(node, opset):
    """`opset` as an int, or None; anything else is the caller's mistake, named as such here
    rather than as a comparison failing deep in the registry."""
    if opset is None:
        return None
    if isinstance(opset, bool) or not isinstance(opset, numbers.Integral) or opset < 1:
        raise ContractError(
            _node_label(node),
            "opset",
            "an int >= 1",
            "opset is the model's opset_import version of the node's domain, an int >= 1 "
            f"(or None for the op's newest version); got {opset!r} ({type(opset).__name__})",
        )
    return int(opset)


def entry_for(node, opset=None):
    """The OpEntry of ops() that runs `node` at the model's `opset` for its domain (None: the newest)."""
    _checked_node(node)
    domain = _domain(node)
    opset = _checked_opset(node, opset)
    entry = find_op(domain, node.op_type, opset)
    if entry is not None:
        return entry
    known = [e for e in ops().values() if (e.domain, e.op_type) == (domain, node.op_type)]
    if known:
        versions = ", ".join(str(e) for e in known)
        raise UnsupportedNodeError(f"{domain} {node.op_type} at opset {opset}: the kernels run {versions}")
    raise UnsupportedNodeError(f"no kernel for {domain} {node.op_type}; supported: {_supported()}")


def node_attributes(node) -> dict:
    """The node's attributes as Python values (strings decoded)."""
    if not node.attribute:
        return {}
    from onnx import helper

    values = {}
    for attribute in node.attribute:
        if attribute.ref_attr_name:  # a function body's reference to its caller's attribute
            raise ContractError(
                f"{node.domain or 'ai.onnx'} {node.op_type}",
                f"attribute {attribute.name}",
                "a value",
                f"attribute {attribute.name} refers to the enclosing function's {attribute.ref_attr_name!r} "
                "instead of holding a value: run the node with that attribute resolved",
            )
        value = helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _schema_attributes(entry):
    """The attribute names of the entry's ONNX version (onnx.defs), or None where onnx has no schema of
    that version (com.microsoft ops, an older onnx): the op package's contract alone checks them then."""
    if entry.domain != "ai.onnx":
        return None
    from onnx import defs

    try:
        schema = defs.get_schema(entry.op_type, entry.since_version, "")
    except defs.SchemaError:
        return None
    return set(schema.attributes) if schema.since_version == entry.since_version else None


def _refuse_unknown_attributes(node, entry, label):
    """A ContractError for an attribute given twice, or one the schema of the node's ONNX version lacks."""
    names = [attribute.name for attribute in node.attribute]
    repeated = [name for name in names if names.count(name) > 1]
    if repeated:
        raise ContractError(
            label,
            f"attribute {repeated[0]}",
            "each attribute once",
            f"given {names.count(repeated[0])} times; a node gives each attribute once (ONNX's checker refuses it)",
        )
    known = _schema_attributes(entry)
    unknown = [name for name in names if known is not None and name not in known]
    if unknown:
        in_package = unknown[0] in {a.name for a in entry.module.ATTRIBUTES}
        later = " (a later version of the op has it)" if in_package else ""
        raise ContractError(
            label,
            f"attribute {unknown[0]}",
            "the attributes of its schema",
            f"{entry.op_type}-{entry.since_version} has no attribute {unknown[0]!r}{later}; ONNX's checker takes "
            f"only the attributes of its schema: {', '.join(sorted(known)) or 'none'}",
        )


def _checked_attributes(node, entry, label) -> dict:
    """The node's attributes: each given once, each of the schema of the node's version, and each of
    the ONNX type (INT or FLOAT) the op's schema gives it.

    The kernels' own contract takes an integral float for an int attribute (`num_groups=2.0`), a
    convenience of their Python API; an ONNX node states its attribute's type, and ONNX refuses a
    FLOAT num_groups, so a node is held to the schema here, the same way at every opset.
    """
    if not node.attribute:
        return {}
    _refuse_unknown_attributes(node, entry, label)
    attrs = node_attributes(node)
    from onnx import AttributeProto

    onnx_types = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT}
    kinds = {spec.name: spec.kind for spec in entry.module.ATTRIBUTES}
    for attribute in node.attribute:
        kind = kinds.get(attribute.name)  # an attribute the op does not know: the contract names it
        if kind is not None and attribute.type != onnx_types[kind]:
            wanted = AttributeProto.AttributeType.Name(onnx_types[kind])
            given = AttributeProto.AttributeType.Name(attribute.type)
            raise ContractError(
                label,
                f"attribute {attribute.name}",
                f"an ONNX {wanted} attribute",
                f"the op's schema makes it an ONNX {wanted} attribute; the node gives a {given} "
                f"({attrs[attribute.name]!r})",
            )
    return attrs


def _input_values(label, names, inputs) -> list:
    """The values of the node's inputs `names`, in order, from a sequence in that order or a mapping by name."""
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n and n not in inputs]
        if missing:
            raise ContractError(
                label, "inputs", "a value per input", f"no value for input {', '.join(map(repr, missing))}"
            )
        return [inputs[n] if n else None for n in names]
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise ContractError(
            label,
            "inputs",
            "a sequence",
            "inputs is a sequence (list, tuple) of values in the node's input order or a mapping "
            f"from its input names to values; got {type(inputs).__name__}",
        )
    if len(inputs) != len(names):
        raise ContractError(
            label, "inputs", "a value per input", f"{len(names)} inputs named, {len(inputs)} values given"
        )
    return list(inputs)


def bind_node(node, inputs, *, opset=None) -> NodeCall:
    """Match a node's inputs, attributes and outputs to its op package (no GPU work).

    `inputs`: a sequence in the node's input order (an omitted optional input: None, or a name of
    ""), or a mapping from the node's input names to values. An `opset` that is not an int >= 1
    (or None), `inputs` of neither form or not one value per input, or an attribute not of its
    schema's ONNX type (a FLOAT num_groups) is a ContractError naming it. The call's inputs are in
    the package's form, which for an adapted node differs from the node's (see _adapt): run it with
    run_call, which gives the outputs the node's form back (`output_forms`).
    """
    entry = entry_for(node, opset)
    module = entry.module
    label = f"{entry} node {_node_name(node)!r}"
    names = list(node.input)
    if len(names) > len(module.INPUTS):
        raise UnsupportedNodeError(f"{label}: {len(names)} inputs, the op takes at most {len(module.INPUTS)}")
    values = _input_values(label, names, inputs)
    bound = {}
    for spec, name, value in zip(module.INPUTS, names, values):
        if name and value is not None:
            bound[spec.key] = value
    attrs = _checked_attributes(node, entry, label)
    output_names = tuple(node.output)
    if len(output_names) > len(module.OUTPUTS):
        extra = ", ".join(repr(n) for n in output_names[len(module.OUTPUTS) :] if n)
        if extra:
            raise UnsupportedNodeError(
                f"{label}: asks for outputs {extra}; the kernels compute "
                f"{', '.join(t.role for t in module.OUTPUTS)} only (inference)"
            )
        output_names = output_names[: len(module.OUTPUTS)]
    outputs = tuple(spec.key for spec, name in zip(module.OUTPUTS, output_names) if name)
    if not outputs:
        raise UnsupportedNodeError(f"{label}: asks for no output")
    bound, attrs, forms = _adapt(entry, label, bound, attrs)
    return NodeCall(entry, bound, attrs, outputs, output_names, forms)


def _adapt(entry, label, inputs, attrs):
    """Earlier versions that ops() lists as compatible, and node forms ONNX allows that the package's
    contract does not take, in the form of the package's own version; with the output forms."""
    version = (entry.domain, entry.op_type, entry.since_version)
    if entry.op_type == "BatchNormalization" and entry.domain == "ai.onnx":
        return _adapted_batch_norm(entry, label, inputs, attrs)
    if version == ("ai.onnx", "GroupNormalization", 18):
        x, scale, bias = inputs.get("x"), inputs.get("scale"), inputs.get("bias")
        if "num_groups" not in attrs:
            raise ContractError(
                label, "attribute num_groups", "required", "the attribute is required and has no default"
            )
        groups = attrs["num_groups"]
        if not all(isinstance(v, np.ndarray) for v in (x, scale, bias)):
            given = ", ".join(type(v).__name__ for v in (x, scale, bias))
            raise UnsupportedNodeError(
                f"{label}: needs numpy X, scale and bias (its per-group scale and bias are repeated over "
                f"each group's channels on the host); got {given}"
            )
        channels = x.shape[1] if x.ndim >= 2 else None
        if (
            groups < 1
            or channels is None
            or channels % groups
            or scale.shape != (groups,)
            or bias.shape != (groups,)
        ):
            raise UnsupportedNodeError(
                f"{label}: needs X of (N, C, ...) with num_groups dividing C, and scale and bias of "
                f"(num_groups,) = ({groups},); got X {x.shape}, scale {scale.shape}, bias {bias.shape}"
            )
        per_group = channels // groups
        inputs = {**inputs, "scale": np.repeat(scale, per_group), "bias": np.repeat(bias, per_group)}
    return inputs, attrs, None


# Per BatchNormalization version, the groups of inputs (bind keys) that share one type variable
# (onnx.defs: 14 gives input_mean and input_var U; 15 gives scale and B T1, input_mean and
# input_var T2); a version not listed (9) has one T for all.
_BN_TYPE_GROUPS = {
    14: (("x", "scale", "b"), ("inputMean", "inputVar")),
    15: (("x",), ("scale", "b"), ("inputMean", "inputVar")),
}
_FLOAT_TYPES = (np.dtype(np.float16), np.dtype(np.float32))


def _native_dtypes(inputs):
    """bind key -> the native-order dtype of each numpy array or Tensor input (other array-likes,
    whose dtype numpy may not read, are left to kernel()'s conversion)."""
    return {
        k: np.dtype(v.dtype).newbyteorder("=")
        for k, v in inputs.items()
        if isinstance(v, (np.ndarray, _runtime.Tensor))
    }


def _mixed_float_types(version, dtypes):
    """Whether `dtypes` (bind key -> dtype) mix float16 and float32 the way the version's schema
    allows (one type within each group); False for one type, or a mix the schema does not allow
    (which the package's contract then refuses by name)."""
    groups = [[dtypes[k] for k in group if k in dtypes] for group in _BN_TYPE_GROUPS.get(version, (dtypes,))]
    if not all(t in _FLOAT_TYPES for group in groups for t in group):
        return False
    return all(len(set(group)) <= 1 for group in groups) and len({t for group in groups for t in group}) > 1


def _widened(value):
    """The array in float32 (no copy where it is one); a broadcast placeholder (check_model's) stays
    one, of no memory."""
    if value.size and not any(value.strides):
        return np.broadcast_to(np.array(value.flat[0], np.float32), value.shape)
    return value.astype(np.float32, copy=False)


def _adapted_batch_norm(entry, label, inputs, attrs):
    """ONNX lets X be (N,) ("C is assumed to be 1") and, from version 14, the parameters have float
    types of their own (float16 X with float32 statistics). The package takes rank >= 2 and one
    type, so such a node runs as (N, 1), in float32: the widening is exact, the kernels compute in
    float32 whatever the type, and Y is rounded to X's type once, on the host. numpy inputs only."""
    x = inputs.get("x")
    if x is None:  # the contract names the missing input
        return inputs, attrs, None
    dtypes = _native_dtypes(inputs)
    mixed = _mixed_float_types(entry.since_version, dtypes)
    rank_one = len(getattr(x, "shape", ())) == 1  # numpy arrays and Tensors
    if not (mixed or rank_one):
        return inputs, attrs, None
    if not all(isinstance(v, np.ndarray) for v in inputs.values()):
        why = "X of rank 1 runs as (N, 1)" if rank_one else "mixed float types run in float32"
        given = ", ".join(type(v).__name__ for v in inputs.values())  # in the op's input order
        raise UnsupportedNodeError(f"{label}: needs numpy inputs ({why} on the host); got {given}")
    if rank_one:
        wrong = [k for k, v in inputs.items() if k != "x" and v.shape != (1,)]
        if wrong:
            raise ContractError(
                label,
                f"input {wrong[0]}",
                "C == 1 for a rank-1 X",
                f"X is (N,) = {x.shape}, so C is 1 (ONNX), but {wrong[0]} has shape {inputs[wrong[0]].shape}",
            )
    adapted = {k: _widened(v) if mixed else v for k, v in inputs.items()}
    if rank_one:
        adapted["x"] = adapted["x"].reshape(x.shape[0], 1)
    return adapted, attrs, {"y": (x.shape, dtypes["x"])}


def plan_node(call: NodeCall, *, device=None, variant=None, tunables=None):
    """The op package's plan for a bound node: `.variant`, `.passes`, ..."""
    module = call.module
    shapes = {key: tuple(value.shape) for key, value in call.inputs.items()}
    dtypes = {}
    for spec in module.INPUTS:
        if spec.key in call.inputs:
            dtypes.setdefault(spec.type_var, np.dtype(call.inputs[spec.key].dtype).name)
    return module.plan(
        shapes, dtypes, call.attrs, outputs=call.outputs, device=device, variant=variant, tunables=tunables
    )


def run_node(node, inputs, *, opset=None, device=None, variant=None, tunables=None) -> list:
    """Run `node` on `inputs` (see bind_node); returns one value per node output (None for "").

    `opset` is the model's opset for the node's domain (`opset_import`); None takes the op's newest
    version. An op the kernels do not run, at that opset, raises UnsupportedNodeError listing what
    they do run.
    """
    return run_call(bind_node(node, inputs, opset=opset), device=device, variant=variant, tunables=tunables)


def run_call(call: NodeCall, *, device=None, variant=None, tunables=None) -> list:
    """Run a bound node (bind_node); one value per node output (None for ""), in the node's form."""
    results = call.module.kernel(
        call.inputs, attrs=call.attrs, outputs=call.outputs, device=device, variant=variant, tunables=tunables
    )
    for key, (shape, dtype) in (call.output_forms or {}).items():
        if key in results:  # an adapted node: numpy in, numpy out
            results[key] = results[key].reshape(shape).astype(dtype, copy=False)
    keys = iter(call.outputs)  # the outputs asked for, in the node's order
    return [results[next(keys)] if name else None for name in call.output_names]
