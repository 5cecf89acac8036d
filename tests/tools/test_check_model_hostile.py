"""`python -m generated.check_model` on models and arguments it cannot use: a line, exit 2 (or 3 for a
skipped node), never a traceback."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from generated import check_model


def _save(path, nodes, inputs, initializers=(), opsets=(("", 21),)):
    """A model of `nodes` over graph inputs `inputs` ([(name, elem_type, dims)]), saved at `path`."""
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info(name, elem_type, dims) for name, elem_type, dims in inputs],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
            for node in nodes
            for name in node.output
        ],
        initializer=list(initializers),
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10
    )
    onnx.save(model, path)
    return str(path)


def _group_norm(path, x_type=TensorProto.FLOAT, dims=(2, 4, 3, 3), opsets=(("", 21),)):
    np_type = helper.tensor_dtype_to_np_dtype(x_type)
    params = [numpy_helper.from_array(np.ones(4, np_type), n) for n in ("s", "b")]
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=2)
    return _save(path, [node], [("x", x_type, list(dims))], params, opsets)


def _lines(capsys):
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return captured.out.splitlines()


def test_a_node_whose_inputs_are_all_omitted_is_a_failed_line(tmp_path, capsys):
    node = helper.make_node("InstanceNormalization", ["", "", ""], ["y"], name="empty")
    path = _save(tmp_path / "empty_inputs.onnx", [node], [], opsets=(("", 17),))
    assert check_model.main([path]) == 1
    lines = _lines(capsys)
    assert lines[0].startswith(
        "empty: InstanceNormalization-6 -, -, - (no inputs): FAILED: ContractError: "
    ), lines
    assert "required input input is missing" in lines[0]
    assert lines[1] == "1 normalization nodes run, 1 outside tolerance or failed, 0 skipped"


def test_a_negative_input_dimension_is_a_skip_line_that_points_at_dim(tmp_path, capsys):
    path = _group_norm(tmp_path / "negdim.onnx", dims=(-1, 4, 3, 3))
    assert check_model.main([path]) == 3
    lines = _lines(capsys)
    assert lines[0] == (
        "gn: ai.onnx GroupNormalization (opset 21): skipped: input 'x': shape (-1, 4, 3, 3) has dimension 0 = -1, "
        "not a size; an unknown dimension is a named one (dim_param), which --dim NAME=SIZE sets (else 1)"
    ), lines
    assert lines[1] == "0 normalization nodes run, 0 outside tolerance or failed, 1 skipped"


@pytest.mark.parametrize("seed", ["-1", "1.5", "x"])
def test_a_seed_that_is_not_a_whole_number_is_exit_2(tmp_path, capsys, seed):
    path = _group_norm(tmp_path / "gn.onnx")
    with pytest.raises(SystemExit) as exited:
        check_model.main([path, "--seed", seed])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert f"argument --seed: expected a whole number >= 0 (numpy's seeds are), got {seed!r}" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_a_domain_the_model_imports_no_opset_for_is_named(tmp_path, capsys):
    path = _group_norm(tmp_path / "noopset.onnx", opsets=(("com.microsoft", 1),))
    assert check_model.main([path]) == 3
    lines = _lines(capsys)
    assert lines[0] == (
        "gn: ai.onnx GroupNormalization (opset not imported): skipped: the model imports no opset for domain "
        "ai.onnx (its opset_import: com.microsoft 1), so no version of GroupNormalization is defined"
    ), lines


def test_an_element_type_the_kernels_do_not_take_is_named(tmp_path, capsys):
    path = _group_norm(tmp_path / "f64.onnx", x_type=TensorProto.DOUBLE)
    assert check_model.main([path, "--allow-skips"]) == 0
    lines = _lines(capsys)
    assert lines[0] == (
        "gn: ai.onnx GroupNormalization (opset 21): skipped: input 'x': float64 is not a type these kernels "
        "take (float32, float16)"
    ), lines


def test_a_dimension_past_int64_is_exit_2(tmp_path, capsys):
    path = _group_norm(tmp_path / "gn.onnx", dims=("N", 4, 3, 3))
    with pytest.raises(SystemExit) as exit_:
        check_model.main([path, "--dim", "N=99999999999999999999"])
    assert exit_.value.code == 2
    assert "a dimension is below 2**63" in capsys.readouterr().err


def test_nodes_in_subgraphs_and_functions_get_a_skip_line(tmp_path, capsys):
    """A GroupNormalization in an If branch or a model-local function was passed by without a line
    ("0 normalization nodes run", exit 0: an audit found it)."""
    params = [numpy_helper.from_array(np.ones(4, np.float32), n) for n in ("s", "b")]
    inner = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="inner", num_groups=2)
    branch = helper.make_graph(
        [inner], "branch", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch, else_branch=branch)
    path = _save(
        tmp_path / "subgraph.onnx", [node], [("x", TensorProto.FLOAT, [2, 4, 3, 3])], params + [cond]
    )
    assert check_model.main([path]) == 3
    lines = _lines(capsys)
    assert (
        "inner in subgraph then_branch of if: GroupNormalization: skipped: only the main graph's nodes run"
        in lines
    )
    assert lines[-1] == "0 normalization nodes run, 0 outside tolerance or failed, 2 skipped"

    model = onnx.load(path)
    function = helper.make_function(
        "local", "F", ["x", "s", "b"], ["y"], [inner], [helper.make_opsetid("", 21)]
    )
    model.graph.ClearField("node")
    model.graph.node.append(helper.make_node("F", ["x", "s", "b"], ["y"], domain="local"))
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(function)
    onnx.save(model, tmp_path / "function.onnx")
    assert check_model.main([str(tmp_path / "function.onnx")]) == 3
    assert "inner in function F: GroupNormalization: skipped: only the main graph's nodes run" in _lines(
        capsys
    )


def test_a_tensor_read_twice_gets_one_array(tmp_path, capsys):
    """InstanceNormalization(x, s, s): ONNX Runtime gets one array for s, so must the kernel (an audit
    found a separate draw per position, and a correct node reported OUTSIDE TOLERANCE)."""
    node = helper.make_node("InstanceNormalization", ["x", "s", "s"], ["y"], name="shared")
    path = _save(
        tmp_path / "shared.onnx", [node], [("x", TensorProto.FLOAT, [1, 8, 5]), ("s", TensorProto.FLOAT, [8])]
    )
    assert check_model.main([path]) == 0
    lines = _lines(capsys)
    assert lines[0].startswith("shared: InstanceNormalization-6 1x8x5, 8, 8 float32: variant ") and lines[
        0
    ].endswith(": ok"), lines


def test_an_empty_batch_is_an_ok_line_without_a_reference(tmp_path, capsys):
    """ONNX Runtime's GroupNormalization fails on N = 0; the kernels give the empty output."""
    path = _group_norm(tmp_path / "empty.onnx", dims=("N", 4, 3, 3))
    assert check_model.main([path, "--dim", "N=0"]) == 0
    lines = _lines(capsys)
    assert (
        lines[0]
        == "gn: GroupNormalization-21 0x4x3x3, 4, 4 float32: empty output 0x4x3x3 (no work to run, nothing to compare): ok"
    ), lines


def test_more_elements_than_an_index_holds_is_a_skip_line(tmp_path, capsys):
    path = _group_norm(tmp_path / "huge.onnx", dims=("N", 4, 3, 3))
    assert check_model.main([path, "--dim", f"N={2**63 - 1}"]) == 3
    lines = _lines(capsys)
    assert "skipped: input 'x'" in lines[0] and "more than 2**63 - 1" in lines[0], lines


@pytest.mark.parametrize("dim", ["N=\u00b2", "N=\u0663"])
def test_a_dimension_in_other_digits_is_exit_2(tmp_path, capsys, dim):
    path = _group_norm(tmp_path / "digits.onnx", dims=("N", 4, 3, 3))
    with pytest.raises(SystemExit) as exit_:
        check_model.main([path, "--dim", dim])
    assert exit_.value.code == 2
    assert "expected NAME=SIZE" in capsys.readouterr().err


def test_a_model_without_normalization_nodes_is_exit_3_unless_skips_are_allowed(tmp_path, capsys):
    """It ran nothing: an audit found exit 0 on models whose nodes it could not see."""
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    path = _save(tmp_path / "relu.onnx", [node], [("x", TensorProto.FLOAT, [2, 3])])
    assert check_model.main([path]) == 3
    assert _lines(capsys) == ["0 normalization nodes run, 0 outside tolerance or failed, 0 skipped"]
    assert check_model.main([path, "--allow-skips"]) == 0


def test_a_normalization_node_without_a_kernel_gets_a_skip_line(tmp_path, capsys):
    """LpNormalization has no kernel here: a line, counted, exit 3."""
    node = helper.make_node("LpNormalization", ["x"], ["y"], name="lp")
    path = _save(tmp_path / "lp.onnx", [node], [("x", TensorProto.FLOAT, [2, 3])])
    assert check_model.main([path]) == 3
    lines = _lines(capsys)
    assert lines[0].startswith(
        "lp: ai.onnx LpNormalization (opset 21): skipped: no kernel for ai.onnx LpNormalization"
    ), lines
    assert lines[-1] == "0 normalization nodes run, 0 outside tolerance or failed, 1 skipped"


def test_parameters_from_constant_nodes_are_the_model_s_own(tmp_path, capsys, monkeypatch):
    """Scale and bias from Constant nodes were replaced by random values: the kernel must see the
    model's, which a scale of zeros and a bias of 7 make visible (every output 7)."""
    seen = []
    real = check_model.run_call
    monkeypatch.setattr(
        check_model, "run_call", lambda call, *a, **k: seen.append(call) or real(call, *a, **k)
    )
    nodes = [
        helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.zeros(4, np.float32))),
        helper.make_node("Constant", [], ["b"], value_floats=[7.0, 7.0, 7.0, 7.0]),
        helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=2),
    ]
    path = _save(tmp_path / "constants.onnx", nodes, [("x", TensorProto.FLOAT, [2, 4, 3, 3])])
    assert check_model.main([path]) == 0
    assert _lines(capsys)[-1] == "1 normalization nodes run, 0 outside tolerance or failed, 0 skipped"
    (call,) = seen
    np.testing.assert_array_equal(call.inputs["scale"], np.zeros(4, np.float32))
    np.testing.assert_array_equal(call.inputs["bias"], np.full(4, 7.0, np.float32))


def test_shapes_onnx_inference_cannot_follow_come_from_symbolic_inference(tmp_path, capsys):
    """The legacy exporter's Shape -> Concat -> Reshape in front of a normalization: onnx's shape
    inference leaves the Reshape's output shape unknown, ONNX Runtime's symbolic inference has it."""
    params = [numpy_helper.from_array(np.ones(4, np.float32), n) for n in ("s", "b")]
    tail = numpy_helper.from_array(np.array([4, 9], np.int64), "tail")
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], end=1),
        helper.make_node("Concat", ["shape", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("InstanceNormalization", ["flat", "s", "b"], ["y"], name="in"),
    ]
    path = _save(
        tmp_path / "reshape.onnx", nodes, [("x", TensorProto.FLOAT, ["N", 4, 3, 3])], params + [tail]
    )
    assert check_model.main([path, "--dim", "N=2"]) == 0
    lines = _lines(capsys)
    assert lines[0].startswith("in: InstanceNormalization-6 2x4x9, 4, 4 float32: variant "), lines
