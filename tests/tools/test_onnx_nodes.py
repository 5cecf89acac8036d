"""ONNX models: the registry `generated.ops()`, `generated.onnx_nodes.run_node` and `python -m generated.check_model`."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

import generated
from generated import ContractError, check_model
from codegen.onnx_versions import NOT_IN_ONNX_DEFS
from generated.onnx_nodes import UnsupportedNodeError, bind_node, run_node
from tests.oracles import (
    assert_close,
    batch_normalization_ref,
    group_normalization_ref,
    instance_normalization_ref,
    microsoft_group_norm_ref,
    rng_for,
    seed_note,
    skip_group_norm_ref,
)

REPO = Path(__file__).resolve().parents[2]


def _versions(domain, op_type):
    """Every since_version of an op in onnx.defs (ai.onnx is "" there)."""
    onnx_domain = "" if domain == "ai.onnx" else domain
    return sorted(
        {
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if (s.domain, s.name) == (onnx_domain, op_type)
        }
    )


def test_registry_maps_onnx_versions_to_the_op_packages():
    ops = generated.ops()
    assert set(ops) == {
        ("ai.onnx", "BatchNormalization", 9),
        ("ai.onnx", "BatchNormalization", 14),
        ("ai.onnx", "BatchNormalization", 15),
        ("ai.onnx", "GroupNormalization", 18),
        ("ai.onnx", "GroupNormalization", 21),
        ("ai.onnx", "InstanceNormalization", 6),
        ("ai.onnx", "InstanceNormalization", 22),
        ("com.microsoft", "SkipGroupNorm", 1),
        ("ai.onnx", "LayerNormalization", 17),
        ("ai.onnx", "RMSNormalization", 23),
        ("ai.onnx", "SimplifiedLayerNormalization", 1),
        ("com.microsoft", "SimplifiedLayerNormalization", 1),
        ("com.microsoft", "SkipLayerNormalization", 1),
        ("com.microsoft", "SkipSimplifiedLayerNormalization", 1),
        ("com.microsoft", "GroupNorm", 1),
    }
    spans = {key: (e.module.__name__.split(".")[-1], e.first_opset, e.last_opset) for key, e in ops.items()}
    assert spans[("ai.onnx", "BatchNormalization", 15)] == ("batch_normalization", 15, None)
    assert spans[("ai.onnx", "BatchNormalization", 9)] == ("batch_normalization", 9, 13)
    assert spans[("ai.onnx", "GroupNormalization", 21)] == ("group_normalization", 21, None)
    assert spans[("ai.onnx", "GroupNormalization", 18)] == ("group_normalization", 18, 20)
    assert spans[("ai.onnx", "InstanceNormalization", 6)] == ("instance_normalization", 6, 21)
    assert spans[("ai.onnx", "InstanceNormalization", 22)] == ("instance_normalization", 22, None)
    assert spans[("com.microsoft", "SkipGroupNorm", 1)] == ("skip_group_norm", 1, None)
    assert spans[("com.microsoft", "GroupNorm", 1)] == ("group_norm", 1, None)
    # The package's own version has no note; the adapted ones say how.
    assert ops[("ai.onnx", "GroupNormalization", 21)].note == ""
    assert "per group" in ops[("ai.onnx", "GroupNormalization", 18)].note
    assert generated.find_op("", "InstanceNormalization", 17).since_version == 6
    assert generated.find_op("ai.onnx", "BatchNormalization", 7) is None
    assert generated.find_op("", "GroupNormalization", None).since_version == 21
    assert generated.find_op("", "LayerNormalization", 16) is None
    assert generated.find_op("", "LayerNormalization", 17).module.__name__.endswith(".layer_normalization")
    # ONNX Runtime's contrib SimplifiedLayerNormalization sits in ai.onnx at version 1: every opset.
    assert generated.find_op("", "SimplifiedLayerNormalization", 23).since_version == 1
    alias = ops[("com.microsoft", "SimplifiedLayerNormalization", 1)]
    assert alias.module is ops[("ai.onnx", "SimplifiedLayerNormalization", 1)].module and alias.note


def test_registry_agrees_with_onnx_defs():
    """Each entry's opsets run from its since_version to the opset before onnx's next version of the op."""
    newest = onnx.defs.onnx_opset_version()
    for (domain, op_type, since), entry in generated.ops().items():
        if domain != "ai.onnx" or (domain, op_type) in NOT_IN_ONNX_DEFS:
            continue  # checked against ONNX Runtime's schemas below
        versions = _versions(domain, op_type)
        assert since in versions, (op_type, since, versions)
        later = [v for v in versions if v > since]
        assert entry.last_opset == (min(later) - 1 if later else None), (op_type, since, versions)
        assert later or newest >= since
        # Inputs by position and attributes by name: the package's own, or fewer (an adapted version).
        schema = onnx.defs.get_schema(op_type, since)
        module = entry.module
        assert len(schema.inputs) == len(module.INPUTS) and len(schema.outputs) >= 1
        if not entry.note:
            assert [i.name for i in schema.inputs] == [t.role for t in module.INPUTS]
        assert set(schema.attributes) <= {a.name for a in module.ATTRIBUTES}
        # run_node holds a node's attributes to these types (INT or FLOAT), from the package's kinds.
        kinds = {a.name: a.kind for a in module.ATTRIBUTES}
        for name, attribute in schema.attributes.items():
            assert attribute.type.name == kinds[name].upper(), (op_type, since, name)


def _node(op_type, inputs, outputs=("Y",), domain="", **attrs):
    inputs = inputs.split() if isinstance(inputs, str) else list(inputs)
    return helper.make_node(op_type, inputs, list(outputs), domain=domain, name=op_type.lower(), **attrs)


def test_run_node_runs_every_op(device):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 3, 5)).astype(np.float32)
    c = rng.uniform(0.5, 1.5, (5, 8)).astype(np.float32)

    (y,) = run_node(
        _node("BatchNormalization", "x s b m v", epsilon=1e-3), [x, *c[:4]], opset=15, device=device
    )
    assert_close(y, batch_normalization_ref(x, *c[:4], epsilon=1e-3), np.float32, "BatchNormalization")

    node = _node("InstanceNormalization", ["x", "s", "b"], ["out"])
    (y,) = run_node(node, {"x": x, "s": c[0], "b": c[1]}, opset=22, device=device)
    assert_close(y, instance_normalization_ref(x, c[0], c[1]), np.float32, "InstanceNormalization")

    (y,) = run_node(
        _node("GroupNormalization", "x s b", num_groups=4), [x, c[0], c[1]], opset=21, device=device
    )
    assert_close(y, group_normalization_ref(x, c[0], c[1], 4), np.float32, "GroupNormalization-21")

    # Opset 18: scale and bias per group, repeated over each group's channels.
    g_scale, g_bias = c[2][:4], c[3][:4]
    (y,) = run_node(
        _node("GroupNormalization", "x s b", num_groups=4), [x, g_scale, g_bias], opset=18, device=device
    )
    ref = group_normalization_ref(x, np.repeat(g_scale, 2), np.repeat(g_bias, 2), 4)
    assert_close(y, ref, np.float32, "GroupNormalization-18")

    xs = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)  # channels last
    skip = rng.standard_normal((2, 8)).astype(np.float32)
    node = _node(
        "SkipGroupNorm",
        ["X", "gamma", "beta", "skip", ""],
        ["Y", "S"],
        "com.microsoft",
        groups=2,
        activation=1,
    )
    y, s = run_node(node, [xs, c[0], c[1], skip, None], opset=1, device=device)
    ref_y, ref_s = skip_group_norm_ref(xs, c[0], c[1], skip, None, 2, 1e-5, 1, 1, np.float32)
    assert_close(y, ref_y, np.float32, "SkipGroupNorm Y")
    assert_close(s, ref_s, np.float32, "SkipGroupNorm S")
    # An output not asked for ("") is None.
    node = _node(
        "SkipGroupNorm", ["X", "gamma", "beta", "skip"], ["Y", ""], "com.microsoft", groups=2, activation=0
    )
    y, s = run_node(node, [xs, c[0], c[1], skip], opset=1, device=device)
    assert s is None and y.shape == xs.shape

    # com.microsoft GroupNorm: float16 X with float32 gamma and beta, channels_last absent (1).
    node = _node("GroupNorm", ["X", "gamma", "beta"], ["Y"], "com.microsoft", groups=4, activation=1)
    (y,) = run_node(node, [xs.astype(np.float16), c[0], c[1]], opset=1, device=device)
    ref = microsoft_group_norm_ref(xs.astype(np.float16), c[0], c[1], 4, 1e-5, 1, 1)
    assert y.dtype == np.float16 and y.shape == xs.shape
    assert_close(y, ref, np.float16, "com.microsoft GroupNorm")


def _ort_schemas():
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return {(s.domain or "ai.onnx", s.name, s.since_version): s for s in state.get_all_operator_schema()}


def test_onnx_runtime_ops_agree_with_onnx_runtime_schemas():
    """The ops onnx.defs does not define (ONNX Runtime's contrib ops, in com.microsoft or in ai.onnx):
    inputs and outputs by position with ONNX Runtime's names, its attributes the package's."""
    schemas = _ort_schemas()
    for (domain, op_type, since), entry in generated.ops().items():
        if domain == "ai.onnx" and (domain, op_type) not in NOT_IN_ONNX_DEFS or entry.note:
            continue
        schema = schemas.get((domain, op_type, since))
        if schema is None:  # com.microsoft SkipGroupNorm: ONNX Runtime's CUDA build registers it
            assert op_type == "SkipGroupNorm", (domain, op_type, since)
            continue
        module = entry.module
        assert [i.name for i in schema.inputs] == [t.role for t in module.INPUTS], op_type
        assert [o.name for o in schema.outputs] == [t.role for t in module.OUTPUTS], op_type
        assert set(schema.attributes) == {a.name for a in module.ATTRIBUTES}, op_type


def test_run_node_refuses_clearly():
    x = np.ones((1, 4, 2, 2), np.float32)
    with pytest.raises(
        UnsupportedNodeError,
        match=r"no kernel for ai.onnx MeanVarianceNormalization; supported: .*GroupNormalization-21",
    ):
        run_node(_node("MeanVarianceNormalization", "x"), [x])
    with pytest.raises(UnsupportedNodeError, match=r"LayerNormalization at opset 16: the kernels run .*-17"):
        run_node(_node("LayerNormalization", "x s"), [x, x[0, :, 0, 0]], opset=16)
    with pytest.raises(
        UnsupportedNodeError, match=r"BatchNormalization at opset 7: the kernels run .*BatchNormalization-9"
    ):
        run_node(_node("BatchNormalization", "x s b m v"), [x] * 5, opset=7)
    training = _node("BatchNormalization", "x s b m v", ["Y", "running_mean", "running_var"], training_mode=1)
    with pytest.raises(UnsupportedNodeError, match=r"asks for outputs 'running_mean', 'running_var'.*Y only"):
        run_node(training, [x] * 5, opset=15)
    with pytest.raises(generated.ContractError, match=r"inputs: 3 inputs named, 2 values given"):
        run_node(_node("InstanceNormalization", "x s b"), [x, x], opset=6)
    with pytest.raises(generated.ContractError, match=r"inputs: no value for input 'b'"):
        run_node(_node("InstanceNormalization", "x s b"), {"x": x, "s": x}, opset=6)
    bad_groups = _node("GroupNormalization", "x s b", num_groups=3)
    with pytest.raises(UnsupportedNodeError, match=r"num_groups dividing C"):
        run_node(bad_groups, [x, np.ones(3, np.float32), np.ones(3, np.float32)], opset=18)
    # The op's own contract checks the attributes: an unknown one is a ContractError naming it.
    with pytest.raises(generated.ContractError, match="spatial"):
        run_node(
            _node("InstanceNormalization", "x s b", spatial=1),
            [x, np.ones(4, np.float32), np.ones(4, np.float32)],
        )


@pytest.mark.parametrize("opset", ["21", True, -1, 0, 1.5])
def test_run_node_refuses_an_opset_that_is_not_a_whole_number(opset):
    x, s = np.ones((1, 4, 2, 2), np.float32), np.ones(4, np.float32)
    with pytest.raises(
        generated.ContractError,
        match=rf"GroupNormalization node 'groupnormalization': opset: .*an int >= 1.*got {opset!r}",
    ):
        run_node(_node("GroupNormalization", "x s b", num_groups=2), [x, s, s], opset=opset)


@pytest.mark.parametrize("inputs", [None, np.ones((3, 4)), "x s b", 3])
def test_run_node_refuses_inputs_that_are_neither_a_sequence_nor_a_mapping(inputs):
    with pytest.raises(
        generated.ContractError, match=rf"inputs: inputs is a sequence .* got {type(inputs).__name__}"
    ):
        run_node(_node("GroupNormalization", "x s b", num_groups=2), inputs, opset=21)


def test_find_op_names_an_opset_that_is_not_an_int():
    with pytest.raises(TypeError, match=r"opset is an int .* got '21'"):
        generated.find_op("", "GroupNormalization", "21")


@pytest.mark.parametrize("opset, per_group", [(21, 4), (18, 2)])
def test_run_node_refuses_a_float_num_groups_at_every_opset(opset, per_group):
    """ONNX makes num_groups INT: a FLOAT 2.0 is refused alike by GroupNormalization-18 and -21
    (the kernels' Python API takes 2.0, an ONNX node states its attribute's type)."""
    x, s = np.ones((1, 4, 2, 2), np.float32), np.ones(per_group, np.float32)
    node = _node("GroupNormalization", "x s b", num_groups=2.0)
    with pytest.raises(
        generated.ContractError,
        match=r"attribute num_groups: .*an ONNX INT attribute; the node gives a FLOAT \(2.0\)",
    ):
        run_node(node, [x, s, s], opset=opset)


@pytest.mark.parametrize(
    "node, got",
    [
        (None, "NoneType"),
        ("GroupNormalization", "str"),
        (
            _node("GroupNormalization", "x s b", num_groups=2).SerializeToString(),
            r"bytes \(a serialized node\? parse it with onnx.NodeProto.FromString\)",
        ),
        (onnx.ModelProto(), "ModelProto"),
    ],
    ids=["None", "str", "bytes", "ModelProto"],
)
def test_run_node_refuses_what_is_not_a_node(node, got):
    x, s = np.ones((1, 4, 2, 2), np.float32), np.ones(4, np.float32)
    with pytest.raises(
        TypeError, match=rf"^node is an onnx NodeProto \(or an object with op_type .*\); got {got}$"
    ):
        run_node(node, [x, s, s], opset=21)


def test_run_node_holds_attributes_to_the_schema_of_the_nodes_version():
    """An attribute the node's ONNX version lacks (a later version's), or one given twice, is refused as
    ONNX's checker refuses it; GroupNormalization-18 without num_groups names the attribute."""
    x, per_group, per_channel = (
        np.ones((1, 4, 2, 2), np.float32),
        np.ones(2, np.float32),
        np.ones(4, np.float32),
    )
    with pytest.raises(
        generated.ContractError,
        match=r"attribute stash_type: GroupNormalization-18 has no attribute 'stash_type' \(a later version of the op has it\); .*: epsilon, num_groups$",
    ):
        run_node(
            _node("GroupNormalization", "x s b", num_groups=2, stash_type=1),
            [x, per_group, per_group],
            opset=18,
        )
    params = [per_channel] * 4
    with pytest.raises(
        generated.ContractError,
        match=r"attribute training_mode: BatchNormalization-9 has no attribute 'training_mode'",
    ):
        run_node(_node("BatchNormalization", "x s b m v", training_mode=0), [x, *params], opset=9)
    twice = _node("GroupNormalization", "x s b", num_groups=2)
    twice.attribute.append(helper.make_attribute("num_groups", 4))
    with pytest.raises(
        generated.ContractError,
        match=r"attribute num_groups: given 2 times; a node gives each attribute once",
    ):
        run_node(twice, [x, per_channel, per_channel], opset=21)
    with pytest.raises(
        generated.ContractError,
        match=r"GroupNormalization-18 .*: attribute num_groups: the attribute is required and has no default",
    ):
        run_node(_node("GroupNormalization", "x s b"), [x, per_group, per_group], opset=18)
    # The versions that have them take them (bound only: no GPU work).
    assert (
        bind_node(
            _node("GroupNormalization", "x s b", num_groups=2, stash_type=1),
            [x, per_channel, per_channel],
            opset=21,
        ).attrs["stash_type"]
        == 1
    )
    assert bind_node(
        _node("BatchNormalization", "x s b m v", training_mode=0), [x, *params], opset=14
    ).attrs == {"training_mode": 0}


def test_the_kernels_do_not_import_onnx():
    code = "import sys, generated, generated.onnx_nodes, generated.check_model; print('onnx' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr


# ---------------------------------------------------------------------------------------------
# check_model


def chain_model(opset, dtype=TensorProto.FLOAT):
    """BatchNormalization -> InstanceNormalization -> GroupNormalization -> com.microsoft SkipGroupNorm
    -> (to NHWC) com.microsoft GroupNorm, with a symbolic batch dimension; GroupNormalization's scale
    and bias are per group below opset 21; GroupNorm's gamma and beta are float32 whatever X is."""
    n_groups, c = 4, 8
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(3)

    def init(name, shape):
        return numpy_helper.from_array(rng.uniform(0.5, 1.5, shape).astype(np_dtype), name)

    per_group = (n_groups,) if opset < 21 else (c,)
    nodes = [
        helper.make_node("BatchNormalization", ["x", "bn_s", "bn_b", "bn_m", "bn_v"], ["a"], name="bn"),
        helper.make_node("InstanceNormalization", ["a", "in_s", "in_b"], ["b"], name="in", epsilon=1e-4),
        helper.make_node("GroupNormalization", ["b", "gn_s", "gn_b"], ["c"], name="gn", num_groups=n_groups),
        helper.make_node(
            "SkipGroupNorm",
            ["c", "sg_g", "sg_b", "skip", "sg_bias"],
            ["y", "s"],
            name="sgn",
            domain="com.microsoft",
            groups=n_groups,
            activation=1,
            channels_last=0,
        ),
        helper.make_node("Transpose", ["y"], ["y_nhwc"], name="nhwc", perm=[0, 2, 3, 1]),
        helper.make_node(
            "GroupNorm",
            ["y_nhwc", "mg_g", "mg_b"],
            ["g"],
            name="mgn",
            domain="com.microsoft",
            groups=2,
            activation=1,
        ),
        helper.make_node("Relu", ["g"], ["z"], name="relu"),
    ]
    initializers = [
        init(n, (c,)) for n in ("bn_s", "bn_b", "bn_m", "bn_v", "in_s", "in_b", "sg_g", "sg_b", "sg_bias")
    ]
    initializers += [init("gn_s", per_group), init("gn_b", per_group)]
    initializers += [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), n) for n in ("mg_g", "mg_b")
    ]
    inputs = [helper.make_tensor_value_info(name, dtype, ["N", c, 4, 6]) for name in ("x", "skip")]
    outputs = [helper.make_tensor_value_info(name, dtype, None) for name in ("z", "s")]
    graph = helper.make_graph(nodes, "chain", inputs, outputs, initializer=initializers)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(
        graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets, True)
    )


@pytest.mark.parametrize(
    "opset, dtype", [(21, TensorProto.FLOAT), (18, TensorProto.FLOAT), (21, TensorProto.FLOAT16)]
)
def test_check_model_runs_every_normalization_node(tmp_path, capsys, opset, dtype):
    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(opset, dtype), path)
    assert check_model.main([str(path), "--dim", "N=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    gn = "GroupNormalization-21 2x8x4x6, 8, 8" if opset == 21 else "GroupNormalization-18 2x8x4x6, 4, 4"
    dtype_name = "float32" if dtype == TensorProto.FLOAT else "float16"
    expected = [
        f"bn: BatchNormalization-15 2x8x4x6, 8, 8, 8, 8 {dtype_name}",
        f"in: InstanceNormalization-6 2x8x4x6, 8, 8 {dtype_name}",
        f"gn: {gn} {dtype_name}",
        f"sgn: SkipGroupNorm-1 2x8x4x6, 8, 8, 2x8x4x6, 8 {dtype_name}",
        f"mgn: GroupNorm-1 2x4x6x8, 8, 8 {dtype_name}",
    ]
    assert len(lines) == 6, lines
    for line, start in zip(lines, expected):
        assert line.startswith(start + ": variant "), line
        assert "of tolerance" in line and " us (" in line and line.endswith(": ok"), line
        # ONNX Runtime ran beside (com.microsoft GroupNorm and SkipGroupNorm as standard ops).
        assert "; ONNX Runtime CPU " in line and "no result" not in line, line
    assert lines[-1] == "5 normalization nodes run, 0 outside tolerance or failed, 0 skipped"


def test_check_model_exits_1_outside_tolerance_and_2_on_an_unreadable_model(tmp_path, capsys, monkeypatch):
    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(21), path)
    real = check_model.run_call
    monkeypatch.setattr(
        check_model,
        "run_call",
        lambda call, *a, **k: [v + 0.01 if v is not None else v for v in real(call, *a, **k)],
    )
    assert check_model.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert out.count("OUTSIDE TOLERANCE") == 5 and "5 outside tolerance or failed" in out
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    assert check_model.main([str(tmp_path / "broken.onnx")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_check_model_says_why_it_skips_a_node(tmp_path, capsys):
    """BatchNormalization-7 (opset 8) is not run; the message names the versions that are."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2])
    params = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in "sbmv"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="old")
    graph = helper.make_graph(
        [node], "old", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], params
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)
    path = tmp_path / "old.onnx"
    onnx.save(model, path)
    assert check_model.main([str(path)]) == 3
    out = capsys.readouterr().out
    assert (
        "old: ai.onnx BatchNormalization (opset 8): skipped: ai.onnx BatchNormalization at opset 8: the kernels run"
        in out
    )
    assert "0 normalization nodes run" in out


def test_worst_error_counts_a_nan_or_infinity_the_reference_lacks():
    def ratio(actual, expected):
        return check_model.worst_error(np.array(actual), np.array(expected), "float32")[1]

    inf, nan = np.inf, np.nan
    assert check_model.worst_error(np.array([1.0, 1.0]), np.array([nan, 1.0]), "float32") == (inf, inf)
    assert ratio([nan, 1.0], [1.0, 1.0]) == inf
    assert ratio([inf], [-inf]) == inf and ratio([inf], [1e30]) == inf and ratio([1.0], [-inf]) == inf
    # The same NaN or infinity on both sides agrees; the finite elements are still compared.
    assert ratio([nan, inf, -inf, 2.0], [nan, inf, -inf, 2.0]) == 0.0
    assert ratio([nan, 1.0 + 2e-4], [nan, 1.0]) == pytest.approx(2e-4 / (1e-5 + 1e-4), rel=1e-6)


def test_check_model_reports_a_nan_in_the_reference_only(tmp_path, capsys, monkeypatch):
    """A reference NaN where the GPU gives a number is outside tolerance, not dropped from the max."""
    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(21), path)
    real = check_model.reference.node_outputs

    def first_value_nan(*args, **kwargs):
        expected = real(*args, **kwargs)
        expected[0].flat[0] = np.nan
        return expected

    monkeypatch.setattr(check_model.reference, "node_outputs", first_value_nan)
    assert check_model.main([str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    for line in lines[:5]:
        assert "max error inf (inf of tolerance)" in line and line.endswith(": OUTSIDE TOLERANCE"), line
    assert lines[-1] == "5 normalization nodes run, 5 outside tolerance or failed, 0 skipped"


def test_check_model_plans_before_drawing_inputs(tmp_path, capsys):
    """A node far over the device's buffer limits is refused on its own line (exit 1), not a
    MemoryError from drawing 2**42 random values; the next node still runs."""
    c = 4
    params = [numpy_helper.from_array(np.ones(c, np.float32), n) for n in ("s", "b", "m", "v")]
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="huge"),
        helper.make_node("BatchNormalization", ["small", "s", "b", "m", "v"], ["z"], name="small"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**20, c, 1024, 1024]),
        helper.make_tensor_value_info("small", TensorProto.FLOAT, [2, c, 3, 3]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    graph = helper.make_graph(nodes, "huge", inputs, outputs, params)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    path = tmp_path / "huge.onnx"
    onnx.save(model, path)
    assert check_model.main([str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(
        "huge: BatchNormalization-15 1048576x4x1024x1024, 4, 4, 4, 4 float32: FAILED: ContractError: "
    ), lines
    assert "maxBufferSize" in lines[0]
    assert lines[1].startswith("small: BatchNormalization-15 2x4x3x3") and lines[1].endswith(": ok"), lines
    assert lines[2] == "2 normalization nodes run, 1 outside tolerance or failed, 0 skipped"


def _bn_model(path, dims=("N", 2, 3, 3)):
    """One BatchNormalization-15 over an input of `dims` (a string is a symbolic dimension)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
    params = [numpy_helper.from_array(np.ones(dims[1], np.float32), n) for n in "sbmv"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")
    graph = helper.make_graph(
        [node], "bn", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], params
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), path)
    return str(path)


def test_check_model_refuses_a_dim_that_no_graph_input_has(tmp_path, capsys):
    path = _bn_model(tmp_path / "bn.onnx")
    assert check_model.main([path, "--dim", "Q=3", "--dim", "n=2"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err
        == "--dim Q, n: no graph input has such a dimension (did you mean N?); the model's symbolic dims are N\n"
    )
    assert captured.out == ""
    fixed = _bn_model(tmp_path / "fixed.onnx", (1, 2, 3, 3))
    assert check_model.main([fixed, "--dim", "N=2"]) == 2
    assert "the model has no symbolic dims" in capsys.readouterr().err


def test_check_model_reads_an_empty_file_as_no_model_and_a_model_without_normalizations_as_nothing_run(
    tmp_path, capsys
):
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert check_model.main([str(tmp_path / "empty.onnx")]) == 2
    assert (
        capsys.readouterr().err
        == f"cannot read {tmp_path / 'empty.onnx'}: not an ONNX model (no IR version, no graph)\n"
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), tmp_path / "relu.onnx")
    assert check_model.main([str(tmp_path / "relu.onnx")]) == 3
    assert capsys.readouterr().out == "0 normalization nodes run, 0 outside tolerance or failed, 0 skipped\n"
    assert check_model.main([str(tmp_path / "relu.onnx"), "--allow-skips"]) == 0


def test_check_model_shows_onnx_runtime_failing_beside_without_ansi_escapes(tmp_path, monkeypatch, capfd):
    """ONNX Runtime beside the float64 judge failing (here a Reshape it cannot do, in place of the
    node's model: no valid normalization node we know of fails there) is said on the node's line,
    in one line without ONNX Runtime's colours, and judges nothing: the node is ok."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 2, 2])
    params = [numpy_helper.from_array(np.ones(4, np.float32), n) for n in ("s", "b")]
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=2)
    graph = helper.make_graph(
        [node], "gn", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], params
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "gn.onnx")

    def unreshapeable(nodes, inputs, outputs, opsets, initializers=()):
        shape = numpy_helper.from_array(np.array([3, -1], np.int64), "shape")
        reshape = helper.make_node("Reshape", [next(iter(inputs)), "shape"], list(outputs))
        tensors = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in inputs.items()
        ]
        graph = helper.make_graph(
            [reshape],
            "broken",
            tensors,
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            [shape],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)

    monkeypatch.setattr(check_model, "_single_node_model", unreshapeable)
    assert check_model.main([str(tmp_path / "gn.onnx"), "--dim", "N=1"]) == 0
    done = capfd.readouterr()
    lines = done.out.splitlines()
    assert (
        len(lines) == 2 and lines[1] == "1 normalization nodes run, 0 outside tolerance or failed, 0 skipped"
    )
    assert lines[0].startswith("gn: GroupNormalization-21 1x4x2x2, 4, 4 float32: variant "), lines
    assert "against float64; ONNX Runtime CPU: no result (" in lines[0] and lines[0].endswith(": ok"), lines
    assert "reshape" in lines[0].lower(), lines
    assert "\x1b" not in done.out + done.err and "onnxruntime" not in done.err, done.err
    assert check_model.one_line(RuntimeError("\x1b[1;31mfirst\n\n  second\n\x1b[m")) == "first second"


def test_check_model_says_when_the_float64_reference_fails(tmp_path, monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise ValueError("no reference for this")

    monkeypatch.setattr(check_model.reference, "node_outputs", failing)
    assert check_model.main([_bn_model(tmp_path / "bn.onnx")]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith("FAILED: the float64 reference failed: ValueError: no reference for this"), line


def test_check_model_without_an_adapter_says_so_in_one_line(tmp_path):
    missing = str(tmp_path / "no-such-icd.json")
    environment = {
        **os.environ,
        "WGPU_BACKEND_TYPE": "Vulkan",
        "VK_ICD_FILENAMES": missing,
        "VK_DRIVER_FILES": missing,
    }
    done = subprocess.run(
        [sys.executable, "-m", "generated.check_model", _bn_model(tmp_path / "bn.onnx")],
        env=environment,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("Forcing backend")]  # wgpu's own
    assert said[0].startswith("no WebGPU adapter: ") and "mesa-vulkan-drivers" in said[1], done.stderr


def test_run_node_refuses_an_attribute_that_refers_to_a_function_attribute():
    """A function body's attribute reference (ref_attr_name) raised onnx.helper's ValueError."""
    node = _node("GroupNormalization", ("X", "scale", "bias"), num_groups=2)
    attribute = onnx.AttributeProto()
    attribute.name, attribute.ref_attr_name, attribute.type = "epsilon", "eps", onnx.AttributeProto.FLOAT
    node.attribute.append(attribute)
    x = np.ones((1, 4, 2, 2), np.float32)
    with pytest.raises(ContractError, match="refers to the enclosing function's 'eps'"):
        run_node(node, [x, np.ones(4, np.float32), np.zeros(4, np.float32)], opset=21)


# --- BatchNormalization forms ONNX allows that the package's contract does not take -------------


def _bn_node():
    return helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)


def _bn_inputs(rng, x_dtype, scale_dtype, stats_dtype, shape=(2, 6, 5, 3)):
    c = shape[1] if len(shape) > 1 else 1
    x = (rng.standard_normal(shape) * 3 + 2).astype(x_dtype)
    scale, bias = rng.standard_normal(c).astype(scale_dtype), rng.standard_normal(c).astype(scale_dtype)
    mean, var = (rng.standard_normal(c) + 2).astype(stats_dtype), rng.uniform(0.1, 2, c).astype(stats_dtype)
    return [x, scale, bias, mean, var]


@pytest.mark.parametrize(
    "opset,x_dtype,scale_dtype,stats_dtype",
    [
        (15, np.float16, np.float32, np.float32),  # mixed-precision exports: float16 X, float32 parameters
        (15, np.float16, np.float16, np.float32),
        (15, np.float32, np.float16, np.float16),
        (15, np.float32, np.float32, np.float16),
        (14, np.float16, np.float16, np.float32),  # 14: input_mean and input_var are U
    ],
)
def test_batch_norm_with_parameters_of_their_own_type_runs_in_float32(
    opset, x_dtype, scale_dtype, stats_dtype, request
):
    """BatchNormalization-14/15 let the parameters have their own float type (an audit found float16 X
    with float32 statistics refused): run in float32, Y rounded to X's type once."""
    rng, seed = rng_for(request.node.name)
    inputs = _bn_inputs(rng, x_dtype, scale_dtype, stats_dtype)
    (y,) = run_node(_bn_node(), inputs, opset=opset)
    assert y.dtype == x_dtype and y.shape == inputs[0].shape
    assert_close(
        y,
        batch_normalization_ref(*inputs, epsilon=1e-3),
        x_dtype,
        f"BatchNormalization-{opset} {seed_note(seed)}",
    )
    # Exactly the float32 kernel's output rounded once: no parameter was rounded to float16 first.
    widened = dict(zip(("x", "scale", "b", "inputMean", "inputVar"), (a.astype(np.float32) for a in inputs)))
    once = generated.batch_normalization.kernel(widened, attrs={"epsilon": 1e-3})["y"].astype(x_dtype)
    assert y.tobytes() == once.tobytes(), seed_note(seed)
    # Big-endian parameters are the same types (the kernels take either byte order).
    swapped = [inputs[0]] + [a.astype(a.dtype.newbyteorder(">")) for a in inputs[1:]]
    (y_swapped,) = run_node(_bn_node(), swapped, opset=opset)
    assert y_swapped.dtype == np.dtype(x_dtype) and y_swapped.tobytes() == y.tobytes()
    with pytest.raises(UnsupportedNodeError, match="mixed float types run in float32"):
        run_node(_bn_node(), [generated.Tensor.from_numpy(a) for a in inputs], opset=opset)


@pytest.mark.parametrize(
    "opset,dtypes",
    [
        (15, (np.float32, np.float16, np.float32, np.float32, np.float32)),  # scale and B are one T1
        (15, (np.float32, np.float32, np.float32, np.float16, np.float32)),  # mean and var are one T2
        (14, (np.float32, np.float16, np.float16, np.float32, np.float32)),  # 14: scale and B are X's T
        (9, (np.float16, np.float32, np.float32, np.float32, np.float32)),  # 9: one T
    ],
)
def test_batch_norm_type_mixes_its_schema_forbids_are_refused(opset, dtypes):
    inputs = [
        a.astype(t)
        for a, t in zip(_bn_inputs(np.random.default_rng(5), np.float32, np.float32, np.float32), dtypes)
    ]
    with pytest.raises(ContractError, match="every T tensor must share one dtype"):
        run_node(_bn_node(), inputs, opset=opset)


def test_batch_norm_of_a_rank_one_x_runs_as_one_channel():
    """ONNX: "accepts single dimension input of size N in which case C is assumed to be 1"."""
    rng = np.random.default_rng(11)
    inputs = _bn_inputs(rng, np.float32, np.float32, np.float32, shape=(7,))
    (y,) = run_node(_bn_node(), inputs, opset=15)
    assert y.shape == (7,) and y.dtype == np.float32
    expected = batch_normalization_ref(inputs[0].reshape(7, 1), *inputs[1:], epsilon=1e-3).reshape(7)
    assert_close(y, expected, np.float32, "rank-1 BatchNormalization")
    (half,) = run_node(_bn_node(), [inputs[0].astype(np.float16)] + inputs[1:], opset=15)  # and mixed
    assert half.shape == (7,) and half.dtype == np.float16
    tensors = [generated.Tensor.from_numpy(a) for a in inputs]
    with pytest.raises(UnsupportedNodeError, match="needs numpy inputs"):
        run_node(_bn_node(), tensors, opset=15)
    # The parameters of a rank-1 X have one value (C is 1): named in the caller's terms.
    with pytest.raises(ContractError, match=r"input scale: .*X is \(N,\) = \(7,\), so C is 1"):
        run_node(_bn_node(), [inputs[0], np.ones(3, np.float32)] + inputs[2:], opset=15)
    (big,) = run_node(_bn_node(), [inputs[0].astype(">f4")] + inputs[1:], opset=15)
    assert big.dtype == np.float32 and big.dtype.isnative and big.tobytes() == y.tobytes()


def test_batch_norm_with_x_omitted_is_the_contracts_refusal():
    """With X omitted and parameter types the schema lets differ, the adapter raised AttributeError;
    now the contract refuses the node by name (its dtype rule comes first here)."""
    node = helper.make_node("BatchNormalization", ["", "s", "b", "m", "v"], ["y"])
    params = [
        np.ones(4, np.float16),
        np.zeros(4, np.float16),
        np.zeros(4, np.float32),
        np.ones(4, np.float32),
    ]
    with pytest.raises(ContractError, match="ai.onnx BatchNormalization-15: input"):
        run_node(node, [None] + params, opset=15)
    with pytest.raises(ContractError, match="required input x is missing"):
        run_node(node, [None] + [p.astype(np.float32) for p in params], opset=15)


def test_batch_norm_takes_array_likes_it_does_not_inspect():
    """An array-like whose dtype numpy cannot read (a torch tensor's, say) reaches kernel(), which
    converts it, as before the adapter (a review found it crashing every BatchNormalization node)."""

    class ArrayLike:
        dtype = "torch.float32"

        def __init__(self, array):
            self.array = array

        def __array__(self, dtype=None, copy=None):
            return self.array

    inputs = _bn_inputs(np.random.default_rng(4), np.float32, np.float32, np.float32)
    (y,) = run_node(_bn_node(), [ArrayLike(inputs[0])] + inputs[1:], opset=15)
    (want,) = run_node(_bn_node(), inputs, opset=15)
    assert y.tobytes() == want.tobytes()


def test_check_model_runs_a_mixed_precision_batch_norm(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4, 3, 3])
    rng = np.random.default_rng(2)
    params = [
        numpy_helper.from_array(a, n)
        for a, n in zip(_bn_inputs(rng, np.float16, np.float32, np.float32, (2, 4, 3, 3))[1:], "sbmv")
    ]
    graph = helper.make_graph(
        [_bn_node()], "bn", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], params
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), tmp_path / "bn.onnx")
    assert check_model.main([str(tmp_path / "bn.onnx")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("node 0: BatchNormalization-15 2x4x3x3, 4, 4, 4, 4 float16") and lines[
        0
    ].endswith(": ok"), lines


def transformer_model(dtype=TensorProto.FLOAT):
    """The layer family in one graph, as transformer exports write it: LayerNormalization-17 (with
    Mean and InvStdDev), com.microsoft SkipLayerNormalization (its skip one (sequence, hidden) block),
    ONNX Runtime's SimplifiedLayerNormalization in ai.onnx and in com.microsoft,
    SkipSimplifiedLayerNormalization and RMSNormalization-23; a symbolic batch dimension."""
    hidden, seq = 64, 5
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(4)

    def init(name, shape):
        return numpy_helper.from_array(rng.uniform(0.5, 1.5, shape).astype(np_dtype), name)

    ms = "com.microsoft"
    nodes = [
        helper.make_node(
            "LayerNormalization", ["x", "g1", "b1"], ["a", "mean", "inv"], name="ln", epsilon=1e-5
        ),
        helper.make_node(
            "SkipLayerNormalization",
            ["a", "skip", "g2", "b2", "bias"],
            ["b", "", "", "s"],
            name="skln",
            domain=ms,
            epsilon=1e-5,
        ),
        helper.make_node(
            "SimplifiedLayerNormalization", ["b", "g3"], ["c", "c_inv"], name="sln", epsilon=1e-6
        ),
        helper.make_node("SimplifiedLayerNormalization", ["c", "g3"], ["d"], name="sln_ms", domain=ms),
        helper.make_node(
            "SkipSimplifiedLayerNormalization", ["d", "s", "g4"], ["e", "", "e_inv"], name="sksln", domain=ms
        ),
        helper.make_node("RMSNormalization", ["e", "g5"], ["y"], name="rms"),
    ]
    initializers = [init(n, (hidden,)) for n in ("g1", "b1", "g2", "b2", "bias", "g3", "g4", "g5")]
    initializers.append(init("skip", (seq, hidden)))
    inputs = [helper.make_tensor_value_info("x", dtype, ["N", seq, hidden])]
    outputs = [
        helper.make_tensor_value_info(name, dtype, None) for name in ("y", "mean", "inv", "c_inv", "e_inv")
    ]
    graph = helper.make_graph(nodes, "transformer", inputs, outputs, initializer=initializers)
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid(ms, 1)]
    return helper.make_model(
        graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets, True)
    )


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["f32", "f16"])
def test_check_model_runs_and_judges_the_layer_family(tmp_path, capsys, dtype):
    """Once these ops run, check_model runs and judges them (it gave them skip lines before)."""
    path = tmp_path / "transformer.onnx"
    onnx.save(transformer_model(dtype), path)
    assert check_model.main([str(path), "--dim", "N=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = ["ln", "skln", "sln", "sln_ms", "sksln", "rms"]
    assert len(lines) == len(names) + 1, lines
    for line, name in zip(lines, names):
        assert line.startswith(f"{name}: ") and ": variant row_registers:" in line, line
        assert "of tolerance" in line and line.endswith(": ok"), line
    assert lines[-1] == f"{len(names)} normalization nodes run, 0 outside tolerance or failed, 0 skipped"
