# SPDX-License-Identifier: Apache-2.0
"""`python -m generated.check_model MODEL.onnx`: every normalization node of a model, on the GPU, against float64.

For each node of the normalization family (`normalization_ops()`), in graph order:

- shapes and element types from onnx shape inference, then ONNX Runtime's symbolic shape inference
  where onnx's leaves a gap (the legacy exporter's Shape -> Gather -> Concat -> Reshape chains,
  computed Pads, com.microsoft ops), with every unknown or symbolic dimension of the graph inputs
  set to 1 (or to `--dim NAME=VALUE`); outputs of the nodes run here fill in what is still unknown;
- the node planned first, on placeholders of its input shapes, so that sizes the device cannot take
  are refused (a FAILED line) before any input is drawn;
- inputs: the model's initializers and `Constant` outputs where the node reads one, else random
  values (seeded): normal for data, uniform in [0.5, 1.5) for a BatchNormalization variance;
- the node through the generated kernel (`onnx_nodes.run_call`), judged against the float64
  definition of the op (`reference.node_outputs`); ONNX Runtime's CPU result on the same inputs
  (float16 widened to float32; com.microsoft GroupNorm and SkipGroupNorm, which its CPU provider
  lacks, as the equivalent standard-op graphs) is shown beside, as a fraction of the same
  tolerance, never the judge: on planes of a million values its float32 result is itself several
  tolerances off;
- one line per node: op, input shapes and dtype, the variant taken, the largest error against the
  tolerance (float32: 1e-5 + 1e-4 * |ref|; float16: 2e-3 + 2e-3 * |ref|; a NaN or infinity is
  within it only where the reference has the same), GPU time (timestamp queries when the device
  has them, else wall clock of queue-synced calls).

A node is skipped, on a line saying why, when the kernels have no version of it (at the model's
opset), when the model imports no opset for its domain, when it sits in a subgraph or a function,
or when an input's shape or element type is unknown, its shape has a negative dimension (a
dim_value of -1) or its type is not float32/float16; a node that omits a required input (every
input name empty, say) is a FAILED line. The last line counts the nodes run, failed and skipped.

Exit status: 0 when every normalization node ran within tolerance; 1 when one is outside it (or
fails) or there is no WebGPU adapter; 2 for a model that cannot be read (a file onnx cannot parse,
or one without an IR version or a graph, such as an empty file), a `--dim` that no graph input
has, or a `--dim` size or `--seed` that is not a whole number >= 0; 3 when none failed but nodes
were skipped or none ran (a model with no normalization node included), unless `--allow-skips`.
Needs `onnx`, `onnxruntime` and `sympy` (the `check` extra; the kernels themselves need none).
It imports the package relatively.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import math
import re
import statistics
import sys
import time
from typing import NamedTuple

import numpy as np

from . import _runtime, doctor, find_op, ops, reference
from .onnx_nodes import UnsupportedNodeError, bind_node, entry_for, node_attributes, plan_node, run_call

TOLERANCES = {"float32": (1e-5, 1e-4), "float16": (2e-3, 2e-3)}
ONNX_TYPES = {1: "float32", 10: "float16"}  # TensorProto element types the kernels take
NUMPY_NAMES = {"float": "float32", "double": "float64"}  # TensorProto names that are not numpy's
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # ONNX Runtime colours its log lines


def _opsets(model) -> dict:
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


def _fixed_inputs(model, dims):
    """A copy of the model whose graph inputs have every dimension known (symbolic ones from `dims`, else 1)."""
    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                size = dims.get(dim.dim_param, 1)
                dim.Clear()
                dim.dim_value = size
    return fixed


def _element_type(elem_type):
    """The name of a TensorProto element type (numpy's: float64, int64, bfloat16), or None when undefined."""
    from onnx import TensorProto

    if elem_type == TensorProto.UNDEFINED or elem_type not in TensorProto.DataType.values():
        return None
    name = TensorProto.DataType.Name(elem_type).lower()
    return NUMPY_NAMES.get(name, name)


def _value_infos(graph) -> dict:
    """{name: (shape or None, dtype name or None)} of a graph's inputs, value_info and outputs."""
    known = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            continue
        shape = None
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shape = tuple(d.dim_value for d in tensor.shape.dim)
        known[value.name] = (shape, _element_type(tensor.elem_type))
    return known


def _onnx_inferred(model) -> dict:
    import onnx

    try:
        return _value_infos(onnx.shape_inference.infer_shapes(model).graph)
    except Exception:  # a model onnx cannot infer: what it declares
        return _value_infos(model.graph)


@functools.cache
def _symbolic_shape_inference():
    """ONNX Runtime's SymbolicShapeInference, with a guard its NhwcConv rule lacks: that rule takes
    len() of the output's declared shape, which ONNX Runtime's own optimizer leaves unset on the
    NhwcConv nodes it writes (every optimized Stable Diffusion model has them)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    class GuardedShapeInference(SymbolicShapeInference):
        def _infer_NhwcConv(self, node):  # noqa: N802 (ONNX Runtime's naming)
            self.known_vi_[node.output[0]].type.tensor_type.shape.SetInParent()
            super()._infer_NhwcConv(node)

    return GuardedShapeInference


def _symbolically_inferred(model) -> tuple[dict, str | None]:
    """(what ONNX Runtime's symbolic shape inference knows, None) or ({}, why it could not run).
    It follows what onnx's cannot: the legacy exporter's Shape -> Gather -> Concat -> Reshape
    chains, computed Pads, com.microsoft ops.

    Its loop is run here rather than through `SymbolicShapeInference.infer_shapes`, which raises
    on a partial result (what it did infer is worth having) and then writes
    `sym_shape_infer_temp.onnx` into the working directory."""
    try:
        inference = _symbolic_shape_inference()(2**31 - 1, True, True, 0)  # int_max, auto_merge, guess rank
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
    except Exception as error:  # ImportError (no sympy) included: onnx's shapes are what there is
        return {}, f"{type(error).__name__}: {one_line(error)}"
    return _value_infos(inference.out_mp_.graph), None


def _merged(first: dict, second: dict) -> dict:
    """`first`, with what it does not know (a shape or element type of None) taken from `second`."""
    merged = dict(second)
    for name, (shape, dtype) in first.items():
        other_shape, other_dtype = second.get(name, (None, None))
        merged[name] = (shape if shape is not None else other_shape, dtype or other_dtype)
    return merged


def _constants(graph) -> dict:
    """{output name: TensorProto} of the graph's Constant nodes: parameters as much as initializers."""
    from onnx import helper, numpy_helper

    values = {}
    for node in graph.node:
        if node.op_type != "Constant" or (node.domain or "ai.onnx") != "ai.onnx" or len(node.attribute) != 1:
            continue
        attribute = node.attribute[0]
        value = helper.get_attribute_value(attribute)
        if attribute.name in ("value_float", "value_floats"):  # ONNX floats are float32
            value = numpy_helper.from_array(np.asarray(value, np.float32), node.output[0])
        elif attribute.name in ("value_int", "value_ints"):
            value = numpy_helper.from_array(np.asarray(value, np.int64), node.output[0])
        elif attribute.name != "value":
            continue  # a sparse tensor or strings: no float parameter of a normalization node
        values[node.output[0]] = value
    return values


def _known_tensors(model):
    """({name: (shape or None, dtype name or None)}, {name: TensorProto} of initializers and Constant
    outputs): onnx's shape inference first, ONNX Runtime's symbolic inference where onnx's leaves a
    gap; and why the latter could not run (None when it did)."""
    known = _onnx_inferred(model)
    symbolic, why_not = _symbolically_inferred(model)
    known = _merged(known, symbolic)
    initializers = {t.name: t for t in model.graph.initializer}
    initializers.update(_constants(model.graph))
    for name, tensor in initializers.items():
        known[name] = (tuple(tensor.dims), _element_type(tensor.data_type))
    return known, initializers, why_not


def _random(role, shape, dtype, rng):
    if role == "input_var":
        values = rng.uniform(0.5, 1.5, size=shape)
    else:
        values = rng.standard_normal(size=shape)
    return values.astype(np.float32).astype(dtype)


def _placeholder(shape, dtype):
    """An array of `shape` and `dtype` that takes no memory (one value, broadcast): enough to plan."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def _node_placeholders(node, entry, known, initializers):
    """The node's inputs in its order, to plan with (None for an omitted one), or a reason it cannot run.

    An initializer is its own value; any other input is a placeholder of its inferred shape, drawn
    only once the plan takes the sizes (a model's static dims may be far beyond memory).
    """
    from onnx import numpy_helper

    values = []
    for name in node.input[: len(entry.module.INPUTS)]:
        if not name:
            values.append(None)
            continue
        if name in initializers:
            values.append(numpy_helper.to_array(initializers[name]))
            continue
        shape, dtype = known.get(name, (None, None))
        why = _unusable(name, shape, dtype)
        if why:
            return None, why
        values.append(_placeholder(shape, dtype))
    return values, None


def _unusable(name, shape, dtype):
    """Why input `name`, of inferred `shape` and element type `dtype`, cannot be planned with (or None)."""
    if dtype is None:
        what = "shape and element type" if shape is None else "element type"
        return f"input {name!r}: {what} unknown (float32 or float16 of a known shape needed)"
    if dtype not in ONNX_TYPES.values():
        return f"input {name!r}: {dtype} is not a type these kernels take ({', '.join(ONNX_TYPES.values())})"
    if shape is None:
        return f"input {name!r}: shape unknown (shape inference cannot give it)"
    negative = [i for i, size in enumerate(shape) if size < 0]
    if negative:
        return (
            f"input {name!r}: shape {shape} has dimension {negative[0]} = {shape[negative[0]]}, not a size; "
            "an unknown dimension is a named one (dim_param), which --dim NAME=SIZE sets (else 1)"
        )
    if math.prod(shape) > np.iinfo(np.intp).max:
        return f"input {name!r}: shape {shape} has {math.prod(shape)} elements, more than 2**63 - 1 (no buffer holds them)"
    return None


def _drawn_inputs(node, entry, placeholders, initializers, rng):
    """The placeholders of `_node_placeholders` replaced by random values (seeded), one array per
    tensor name: a node that reads a tensor twice (InstanceNormalization(x, s, s)) gets the same
    values in both places, as ONNX Runtime does (positive ones if either place is a variance)."""
    positions = list(zip(entry.module.INPUTS, node.input, placeholders))
    variances = {name for spec, name, _ in positions if spec.role == "input_var"}
    drawn = {}
    values = []
    for spec, name, value in positions:
        if value is not None and name not in initializers and name not in drawn:
            role = "input_var" if name in variances else spec.role
            drawn[name] = _random(role, value.shape, value.dtype, rng)
        values.append(drawn.get(name, value))
    return values


# ---------------------------------------------------------------------------------------------
# Beside the float64 reference (reference.py, the judge): ONNX Runtime's CPU provider


def _widened(array):
    return array.astype(np.float32) if array.dtype == np.float16 else array


def _single_node_model(nodes, inputs, outputs, opsets, initializers=()):
    """A model of `nodes` with graph inputs `inputs` ({name: array}) and outputs `outputs` (names)."""
    from onnx import helper

    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in inputs.items()
    ]
    graph_outputs = [helper.make_empty_tensor_value_info(name) for name in outputs]
    graph = helper.make_graph(nodes, "reference", graph_inputs, graph_outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("" if d == "ai.onnx" else d, version) for d, version in opsets.items()]
    ir_version = helper.find_min_ir_version_for(imports, ignore_unknown=True)
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version)


def _group_norm_of_sum(total, attrs, channels_last):
    """Nodes from the sum S (named `total`) to Y: GroupNormalization-21, the activation, the layout."""
    from onnx import helper

    nodes = []
    nchw = total
    if channels_last:
        nodes.append(helper.make_node("Transpose", [total], ["s_nchw"], perm=[0, 3, 1, 2]))
        nchw = "s_nchw"
    norm = helper.make_node(
        "GroupNormalization",
        [nchw, "gamma", "beta"],
        ["normed"],
        num_groups=attrs["groups"],
        epsilon=attrs.get("epsilon", 1e-5),
        stash_type=1,
    )
    nodes.append(norm)
    y = "normed"
    if attrs.get("activation"):
        nodes.append(helper.make_node("Sigmoid", [y], ["gate"]))
        nodes.append(helper.make_node("Mul", [y, "gate"], ["activated"]))
        y = "activated"
    nodes.append(
        helper.make_node("Transpose", [y], ["Y"], perm=[0, 2, 3, 1])
        if channels_last
        else helper.make_node("Identity", [y], ["Y"])
    )
    return nodes


def _group_norm_graph(node, values, x_dtype):
    """com.microsoft GroupNorm as standard ops (GroupNormalization-21), for ORT's CPU provider."""
    attrs = node_attributes(node)
    given = {n: v for n, v in zip(["X", "gamma", "beta"], values) if v is not None}
    nodes = _group_norm_of_sum("X", attrs, attrs.get("channels_last", 1) != 0)
    return nodes, {name: _widened(v) for name, v in given.items()}, [], {"ai.onnx": 21}


def _skip_group_norm_graph(node, values, x_dtype):
    """com.microsoft SkipGroupNorm as standard ops (GroupNormalization-21), for ORT's CPU provider."""
    from onnx import TensorProto, helper, numpy_helper

    attrs = node_attributes(node)
    channels_last = attrs.get("channels_last", 1) != 0
    names = ["X", "gamma", "beta", "skip", "bias"]
    given = {n: v for n, v in zip(names, values) if v is not None}
    x = given["X"]
    n, c = (x.shape[0], x.shape[-1]) if channels_last else x.shape[:2]
    nodes, initializers = [], []

    def constant(name, array):
        initializers.append(numpy_helper.from_array(np.asarray(array, np.int64), name))
        return name

    skip = "skip"
    if given["skip"].shape != x.shape:
        per_item = (n, 1, 1, c) if channels_last else (n, c, 1, 1)
        nodes.append(helper.make_node("Reshape", ["skip", constant("skip_shape", per_item)], ["skip_b"]))
        skip = "skip_b"
    nodes.append(helper.make_node("Add", ["X", skip], ["sum0"]))
    total = "sum0"
    if "bias" in given:
        bias = "bias"
        if not channels_last:
            nodes.append(helper.make_node("Reshape", ["bias", constant("bias_shape", (c, 1, 1))], ["bias_b"]))
            bias = "bias_b"
        nodes.append(helper.make_node("Add", [total, bias], ["sum1"]))
        total = "sum1"
    if x_dtype == np.float16:  # S is T: the statistics see the sum rounded to float16
        nodes.append(helper.make_node("Cast", [total], ["sum_f16"], to=TensorProto.FLOAT16))
        nodes.append(helper.make_node("Cast", ["sum_f16"], ["sum_rounded"], to=TensorProto.FLOAT))
        total = "sum_rounded"
    nodes.append(helper.make_node("Identity", [total], ["S"]))
    nodes += _group_norm_of_sum(total, attrs, channels_last)
    feeds = {name: _widened(v) for name, v in given.items()}
    return nodes, feeds, initializers, {"ai.onnx": 21}


# Ops ONNX Runtime's CPU provider lacks, as graphs of standard ops: (graph builder, output names).
STANDARD_OP_GRAPHS = {
    ("com.microsoft", "GroupNorm"): (_group_norm_graph, ["Y"]),
    ("com.microsoft", "SkipGroupNorm"): (_skip_group_norm_graph, ["Y", "S"]),
}


def onnxruntime_outputs(node, entry, values, opsets):
    """The node's outputs from ONNX Runtime's CPU provider, in float32; one per node output (None for "")."""
    import onnxruntime
    from onnx import helper

    outputs = [name for name in node.output if name]
    if (entry.domain, entry.op_type) in STANDARD_OP_GRAPHS:
        graph, positions = STANDARD_OP_GRAPHS[(entry.domain, entry.op_type)]
        nodes, feeds, initializers, imports = graph(node, values, values[0].dtype)
        renamed = {name: positions[i] for i, name in enumerate(node.output) if name}
        model = _single_node_model(nodes, feeds, [renamed[n] for n in outputs], imports, initializers)
        fetch = [renamed[n] for n in outputs]
    else:
        feeds = {name: _widened(v) for name, v in zip(node.input, values) if name and v is not None}
        # An op written in another domain than the one ONNX Runtime registers it in (a com.microsoft
        # SimplifiedLayerNormalization) runs there as the package's own.
        domain = next(e.domain for e in ops().values() if e.module is entry.module and not e.note)
        copy = helper.make_node(node.op_type, list(node.input), list(node.output), domain=domain)
        copy.attribute.extend(node.attribute)
        imports = {domain: opsets.get(domain, entry.since_version)}
        if domain != "ai.onnx":
            imports["ai.onnx"] = opsets.get("ai.onnx", 21)
        model = _single_node_model([copy], feeds, outputs, imports)
        fetch = outputs
    options = onnxruntime.SessionOptions()
    options.log_severity_level = (
        4  # fatal only: an error comes back as the exception, not a coloured log line
    )
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    results = iter(session.run(fetch, feeds))
    return [next(results) if name else None for name in node.output]


# ---------------------------------------------------------------------------------------------
# Timing and comparison


def gpu_time(call, plan, device):
    """(microseconds per call, how it was measured) of the bound node's plan on `device`."""
    from . import bench

    settings = bench.Settings.quick()
    runnable = [p for p in plan.passes if 0 not in p.dispatch]
    if plan.chunks or not runnable:  # pieces or nothing to dispatch: time whole calls
        samples = []
        for _ in range(settings.iters):
            started = time.perf_counter()
            call.module.kernel(call.inputs, attrs=call.attrs, outputs=call.outputs, device=device)
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1e6, "wall clock of whole kernel() calls"
    timer = bench.GpuTimer(device, settings.batch)
    tensors = {
        "input": {
            k: _runtime.Tensor.from_numpy(np.ascontiguousarray(v), device) for k, v in call.inputs.items()
        }
    }
    for kind, group in (("output", plan.outputs), ("intermediate", plan.intermediates)):
        tensors[kind] = {
            k: _runtime.Tensor.empty(shape, dtype, device) for k, (shape, dtype) in group.items()
        }
    try:
        bound = _runtime.bind_passes(runnable, tensors, device)
        samples = timer.measure(
            {"op": lambda encoder, i, ts: _runtime.encode_passes(encoder, bound, ts)}, 1, settings
        )
    finally:
        for group in tensors.values():
            for tensor in group.values():
                tensor.destroy()  # back to the device's pool
    how = "timestamp-query" if timer.timestamps else "wall clock"
    return statistics.median(samples["op"]) * 1e6, how


def worst_error(actual, expected, dtype):
    """(largest |actual - expected|, largest error / tolerance) over the elements; never NaN.

    A NaN or an infinity agrees only with the same in the reference (NaN with NaN, +inf with
    +inf); against anything else it is an error of inf, so it cannot drop out of a max().
    """
    atol, rtol = TOLERANCES[dtype]
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    if actual.shape != expected.shape:
        return float("inf"), float("inf")
    if actual.size == 0:
        return 0.0, 0.0
    finite = np.isfinite(actual) & np.isfinite(expected)
    agree = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
    difference = np.abs(np.where(finite, actual, 0.0) - np.where(finite, expected, 0.0))
    error = np.where(finite, difference, np.where(agree, 0.0, np.inf))
    tolerance = atol + rtol * np.abs(np.where(finite, expected, 0.0))
    return float(error.max()), float((error / tolerance).max())


def _shape_text(values):
    return ", ".join("x".join(map(str, v.shape)) if v is not None else "-" for v in values)


# ---------------------------------------------------------------------------------------------
# Command line


class ReferenceFailed(Exception):
    """The float64 reference could not run the node (the GPU's result is then not checked)."""


def one_line(error):
    """An error's message as one line: ANSI escapes dropped, lines joined (ONNX Runtime's end in a newline)."""
    text = ANSI_ESCAPE.sub("", str(error))
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(error).__name__


def _failure(error):
    if isinstance(error, ReferenceFailed):
        return f"the float64 reference failed: {error}"
    return f"{type(error).__name__}: {one_line(error)}"


class _Context(NamedTuple):
    """What every node of one check shares."""

    initializers: dict  # name -> TensorProto
    rng: np.random.Generator
    device: object
    opsets: dict  # domain -> the model's opset
    known: dict  # tensor name -> (shape or None, dtype name or None), filled in as nodes run


def _run_and_compare(node, entry, placeholders, opset, context: _Context):
    """Plan, draw the inputs, run on the GPU, on the float64 reference and on ONNX Runtime, time:
    (line after the label, ok)."""
    initializers, rng, device, opsets, known = context
    # Planning first: it refuses sizes over the device's limits before any input is drawn.
    plan = plan_node(bind_node(node, placeholders, opset=opset), device=device)
    values = _drawn_inputs(node, entry, placeholders, initializers, rng)
    call = bind_node(node, values, opset=opset)
    results = run_call(call, device=device)
    if all(value is None or value.size == 0 for value in results):
        # An empty tensor (N = 0, say): no value to compare, only the shape, which every output
        # shares with X for these ops (and ONNX Runtime's GroupNormalization fails on N = 0).
        _remember_outputs(node, results, known)
        ok = all(value is None or value.shape == values[0].shape for value in results)
        verdict = "ok" if ok else "WRONG SHAPE"
        return f"empty output {_shape_text(results)} (no work to run, nothing to compare): {verdict}", ok
    try:
        expected = reference.node_outputs(
            entry.domain, entry.op_type, values, node_attributes(node), entry.since_version
        )
    except Exception as error:
        raise ReferenceFailed(f"{type(error).__name__}: {one_line(error)}") from error
    beside = _onnxruntime_beside(node, entry, values, opsets, expected, results)
    micros, how = gpu_time(call, plan, device)
    _remember_outputs(node, results, known)
    worst, ratio = _worst_of(results, expected, results)
    ok = ratio <= 1.0
    line = (
        f"variant {plan.variant}: max error {worst:.3g} ({ratio:.3g} of tolerance) against float64; "
        f"{beside}: GPU {micros:.1f} us ({how}): {'ok' if ok else 'OUTSIDE TOLERANCE'}"
    )
    return line, ok


def _worst_of(outputs, expected, like):
    """(largest error, largest error / tolerance) over the outputs the node asked for, each judged
    at the tolerance of the kernel's output of the same position (`like`)."""
    worst, ratio = 0.0, 0.0
    for value, ref, kernel_value in zip(outputs, expected, like):
        if value is not None and ref is not None and kernel_value is not None:
            error, fraction = worst_error(value, ref, kernel_value.dtype.name)
            worst, ratio = max(worst, error), max(ratio, fraction)
    return worst, ratio


def _onnxruntime_beside(node, entry, values, opsets, expected, results):
    """What ONNX Runtime's CPU provider gets against the same float64 reference, for the line: shown
    beside the kernel's error, never the judge (on large planes its float32 result is itself
    off by several tolerances)."""
    try:
        theirs = onnxruntime_outputs(node, entry, values, opsets)
    except Exception as error:
        return f"ONNX Runtime CPU: no result ({one_line(error)[:120]})"
    _, ratio = _worst_of(theirs, expected, results)
    return f"ONNX Runtime CPU {ratio:.3g} of tolerance"


def _remember_outputs(node, results, known):
    """The node's outputs as inputs of later nodes: their shapes and dtypes."""
    for name, value in zip(node.output, results):
        if name:
            known[name] = (tuple(value.shape), value.dtype.name)


# The normalization family: the nodes check() gives a line, run or not. Those without a kernel
# (here or at the node's opset) get a skipped line, so a model is never passed as checked while
# its normalization nodes went unseen.
OTHER_NORMALIZATIONS = {
    ("ai.onnx", "LpNormalization"),
    ("ai.onnx", "MeanVarianceNormalization"),
    ("com.microsoft", "EmbedLayerNormalization"),
    ("com.microsoft", "LayerNormalization"),
}


def normalization_ops() -> set:
    """(domain, op type) of every node check() reports on."""
    return (
        {(e.domain, e.op_type) for e in ops().values()}
        | reference.ops_with_reference()
        | OTHER_NORMALIZATIONS
    )


class Summary(NamedTuple):
    ran: int  # nodes run through the kernels and compared
    failed: int  # of those, outside tolerance or failed
    skipped: int  # normalization nodes not run, each with a line saying why


def check(model, *, dims=None, seed=0, device=None, out=None) -> Summary:
    """Check every normalization node of `model`, a line each; the counts."""
    out = out or sys.stdout
    device = device or _runtime.default_device()
    rng = np.random.default_rng(seed)
    opsets = _opsets(model)
    known, initializers, why_not_symbolic = _known_tensors(_fixed_inputs(model, dims or {}))
    context = _Context(initializers, rng, device, opsets, known)
    family = normalization_ops()
    ran = failed = skipped = 0
    for index, node in enumerate(model.graph.node):
        if ((node.domain or "ai.onnx"), node.op_type) not in family:
            continue
        line, ok = _check_node(node, node.name or f"node {index}", context)
        ran += ok is not None
        failed += ok is False
        skipped += ok is None
        print(line, file=out)
    for where, node in _nested_nodes(model, family):
        skipped += 1
        print(
            f"{node.name or node.op_type} in {where}: {node.op_type}: skipped: only the main graph's nodes run",
            file=out,
        )
    print(f"{ran} normalization nodes run, {failed} outside tolerance or failed, {skipped} skipped", file=out)
    return Summary(ran, failed, skipped)


def _nested_nodes(model, op_types):
    """(where, node) for the normalization nodes in subgraphs (If, Loop, Scan bodies, at any depth)
    and in model-local functions, which check() does not run: it says so rather than pass them by."""
    from onnx import AttributeProto

    def in_graph(graph, where):
        for node in graph.node:
            if ((node.domain or "ai.onnx"), node.op_type) in op_types and where:
                yield where, node
            for attribute in node.attribute:
                inner = [attribute.g] if attribute.type == AttributeProto.GRAPH else list(attribute.graphs)
                for sub in inner:
                    yield from in_graph(sub, f"subgraph {attribute.name} of {node.name or node.op_type}")

    yield from in_graph(model.graph, "")
    for function in model.functions:
        for node in function.node:
            if ((node.domain or "ai.onnx"), node.op_type) in op_types:
                yield f"function {function.name}", node


def _check_node(node, name, context: _Context):
    """(the node's line, whether it is within tolerance: None when it is skipped, not run)."""
    domain = node.domain or "ai.onnx"
    opset = context.opsets.get(domain)
    label = f"{name}: {domain} {node.op_type} (opset {'not imported' if opset is None else opset})"
    entry, why = _entry_or_why(node, domain, context.opsets)
    if entry is None:
        return f"{label}: skipped: {why}", None
    try:
        placeholders, why = _node_placeholders(node, entry, context.known, context.initializers)
    except Exception as error:  # an initializer numpy cannot read: a line, not a traceback
        return f"{label}: FAILED: {_failure(error)}", False
    if placeholders is None:
        return f"{label}: skipped: {why}", None
    dtypes = [v.dtype.name for v in placeholders if v is not None] or ["(no inputs)"]  # every input omitted
    label = f"{name}: {entry.op_type}-{entry.since_version} {_shape_text(placeholders)} {dtypes[0]}"
    try:
        line, ok = _run_and_compare(node, entry, placeholders, opset, context)
    except Exception as error:  # MemoryError included: a node that cannot run is a line, not a traceback
        line, ok = f"FAILED: {_failure(error)}", False
    return f"{label}: {line}", ok


def _entry_or_why(node, domain, opsets):
    """(the OpEntry that runs `node` at the model's opset of `domain`, None), or (None, why there is none)."""
    if domain not in opsets:
        imported = ", ".join(f"{d} {v}" for d, v in opsets.items()) or "none"
        return None, (
            f"the model imports no opset for domain {domain} (its opset_import: {imported}), "
            f"so no version of {node.op_type} is defined"
        )
    entry = find_op(domain, node.op_type, opsets[domain])
    return (entry, None) if entry is not None else (None, _unsupported(node, opsets[domain]))


def _unsupported(node, opset):
    try:
        entry_for(node, opset)
    except (UnsupportedNodeError, _runtime.ContractError) as error:  # the latter: an opset_import below 1
        reason, _, _supported = str(error).partition("; supported:")
        return f"{reason} (`generated.ops()` lists what runs)"
    return "not supported"


def _seed(text):
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (numpy's seeds are), got {text!r}")
    return int(text)


def _dim(text):
    name, sep, value = text.partition("=")
    if not sep or not name or not (value.isascii() and value.isdigit()):
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE (a whole number), got {text!r}")
    if int(value) >= 2**63:  # an ONNX dimension is an int64
        raise argparse.ArgumentTypeError(f"{name}={value}: a dimension is below 2**63 (an ONNX int64)")
    return name, int(value)


def symbolic_dims(model):
    """The names of the graph inputs' symbolic dimensions, in order of first use."""
    names = {}
    for value in model.graph.input:
        if value.type.HasField("tensor_type"):
            for dim in value.type.tensor_type.shape.dim:
                if not dim.HasField("dim_value") and dim.dim_param:
                    names[dim.dim_param] = None
    return list(names)


def _unknown_dims(model, dims):
    """One line refusing the --dim names that no graph input has, or None when all are used."""
    known = symbolic_dims(model)
    unknown = [name for name in dims if name not in known]
    if not unknown:
        return None
    folded = {name.lower(): name for name in known}  # case folded: n finds N
    close = [
        folded[m] for name in unknown for m in difflib.get_close_matches(name.lower(), list(folded), n=1)
    ]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    have = f"the model's symbolic dims are {', '.join(known)}" if known else "the model has no symbolic dims"
    return f"--dim {', '.join(unknown)}: no graph input has such a dimension{hint}; {have}"


def _load(path):
    """(the model, None) or (None, one line saying why it cannot be read)."""
    try:
        import onnx

        model = onnx.load(path)
    except ImportError as error:
        return None, f"check_model needs onnx and onnxruntime: {error}"
    except Exception as error:
        return None, f"cannot read {path}: {type(error).__name__}: {one_line(error)}"
    missing = [
        what
        for what, there in (("no IR version", model.ir_version), ("no graph", model.HasField("graph")))
        if not there
    ]
    if missing:  # an empty file parses as an empty ModelProto
        return None, f"cannot read {path}: not an ONNX model ({', '.join(missing)})"
    return model, None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.check_model", description=__doc__.splitlines()[0]
    )
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument(
        "--dim",
        type=_dim,
        action="append",
        default=[],
        metavar="NAME=SIZE",
        help="size of a symbolic input dimension (default 1)",
    )
    parser.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs, >= 0 (default 0)")
    parser.add_argument(
        "--allow-skips",
        action="store_true",
        help="exit 0 even when normalization nodes were skipped or none ran (default: exit 3)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    model, why = _load(args.model)
    if model is None:
        print(why, file=sys.stderr)
        return 2
    dims = dict(args.dim)
    why = _unknown_dims(model, dims)
    if why:
        print(why, file=sys.stderr)
        return 2
    device = doctor.open_device(sys.stderr)
    if device is None:
        return 1
    summary = check(model, dims=dims, seed=args.seed, device=device)
    if summary.failed:
        return 1
    if (summary.skipped or not summary.ran) and not args.allow_skips:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
