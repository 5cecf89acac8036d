"""Run one ONNX node (an `onnx.NodeProto`) through the op package that implements it.

    from generated.onnx_nodes import run_node
    (y,) = run_node(node, [x, scale, bias], opset=21)

This file is copied verbatim into ``generated/onnx_nodes.py``; it imports the package only
relatively, and `onnx` only inside the functions that read attributes (values and types), so the
kernels keep needing only wgpu and numpy. Any object with `op_type`, `domain`, `input`, `output`
and `attribute` (each attribute with `name` and an `onnx.AttributeProto` value) is a node here.

The node's inputs and outputs are matched to the op's INPUTS and OUTPUTS by position, as ONNX
defines them; an empty name is an omitted optional input or an output not asked for. The node's
attributes must have the ONNX type of the op's schema (INT or FLOAT) and are then passed as they
are; the op package's contract checks them (an attribute the op does not know, or a value it does
not support, is a `ContractError` naming it).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from . import find_op, ops
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

    @property
    def module(self):
        return self.entry.module


def _domain(node) -> str:
    return node.domain or "ai.onnx"


def _supported() -> str:
    return "; ".join(str(e) for e in ops().values())


def _node_label(node) -> str:
    return f"{_domain(node)} {node.op_type} node {node.name or node.op_type!r}"


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
        value = helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _checked_attributes(node, module, label) -> dict:
    """The node's attributes, each of the ONNX type (INT or FLOAT) the op's schema gives it.

    The kernels' own contract takes an integral float for an int attribute (`num_groups=2.0`), a
    convenience of their Python API; an ONNX node states its attribute's type, and ONNX refuses a
    FLOAT num_groups, so a node is held to the schema here, the same way at every opset.
    """
    attrs = node_attributes(node)
    if not attrs:
        return attrs
    from onnx import AttributeProto

    onnx_types = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT}
    kinds = {spec.name: spec.kind for spec in module.ATTRIBUTES}
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
    schema's ONNX type (a FLOAT num_groups) is a ContractError naming it.
    """
    entry = entry_for(node, opset)
    module = entry.module
    label = f"{entry} node {node.name or node.op_type!r}"
    names = list(node.input)
    if len(names) > len(module.INPUTS):
        raise UnsupportedNodeError(f"{label}: {len(names)} inputs, the op takes at most {len(module.INPUTS)}")
    values = _input_values(label, names, inputs)
    bound = {}
    for spec, name, value in zip(module.INPUTS, names, values):
        if name and value is not None:
            bound[spec.key] = value
    attrs = _checked_attributes(node, module, label)
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
    bound, attrs = _adapt(entry, label, bound, attrs)
    return NodeCall(entry, bound, attrs, outputs, output_names)


def _adapt(entry, label, inputs, attrs):
    """Earlier versions that ops() lists as compatible, in the form of the package's own version."""
    version = (entry.domain, entry.op_type, entry.since_version)
    if version == ("ai.onnx", "GroupNormalization", 18):
        x, scale, bias = inputs.get("x"), inputs.get("scale"), inputs.get("bias")
        groups = attrs.get("num_groups")
        if not all(isinstance(v, np.ndarray) for v in (x, scale, bias)) or not isinstance(groups, int):
            raise UnsupportedNodeError(f"{label}: needs numpy X, scale and bias and an int num_groups")
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
    return inputs, attrs


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
    call = bind_node(node, inputs, opset=opset)
    results = call.module.kernel(
        call.inputs, attrs=call.attrs, outputs=call.outputs, device=device, variant=variant, tunables=tunables
    )
    keys = iter(call.outputs)  # the outputs asked for, in the node's order
    return [results[next(keys)] if name else None for name in call.output_names]
