"""The bench's ONNX Runtime peer (--ort), run here on ONNX Runtime's CPU provider: the one-node
models, the output check against float64, the placement line and the paths timed alike."""

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from generated import bench, bench_ort, group_normalization, skip_group_norm  # noqa: E402


@pytest.fixture
def cpu_bench(device):
    settings = bench.Settings.quick()
    peer = bench_ort.OrtPeer(settings, provider="CPUExecutionProvider", device_name="cpu")
    timer = bench.GpuTimer(device, settings.batch, use_timestamps=False)
    return bench.Bench(device, settings, timer, ort_peer=peer)


def _quick_case(op_name):
    return next(c for c in bench.bench_cases(op_name) if c.quick)


def test_a_case_runs_three_ways_on_both_sides_and_onnx_runtime_is_checked(cpu_bench):
    result = cpu_bench.run(group_normalization, _quick_case("group_normalization"))
    assert result.error is None, result.error
    ort = result.ort
    assert ort["placement"] == "CPUExecutionProvider"
    # Measured, and of the right order: ONNX Runtime's float32 CPU GroupNorm is itself about one
    # tolerance off on rows this long; a model with its inputs out of order would be off by far more.
    assert 0 <= ort["error_of_tolerance"] < 10
    for key in ("ort_numpy_ms", "ours_numpy_ms", "ort_device_ms", "ours_device_ms", "ours_sequence_ms"):
        assert ort[key] > 0, (key, ort)
    table = "\n".join(bench._ort_table([result]))
    assert "| group_normalization |" in table and "CPUExecutionProvider" in table


def test_a_node_the_provider_has_no_kernel_for_is_reported_not_timed(device):
    """ONNX Runtime's CPU provider has no com.microsoft SkipGroupNorm: the session does not load,
    and nothing is timed as that provider."""
    peer = bench_ort.OrtPeer(bench.Settings.quick(), provider="CPUExecutionProvider", device_name="cpu")
    case = min(bench.bench_cases("skip_group_norm"), key=lambda c: sum(map(len, c.shapes.values())))
    arrays = bench.random_inputs(skip_group_norm, case, np.random.default_rng(0))
    attrs = bench.attributes_with_defaults(skip_group_norm, case)
    plan = skip_group_norm.plan(case.shapes, case.dtypes, case.attrs, device=device, outputs=case.outputs)
    outputs = {key: plan.outputs[key][0] for key in bench.requested_outputs(skip_group_norm, case)}
    times = peer.time(skip_group_norm, case, arrays, attrs, outputs)
    assert times.placement.startswith("not on CPUExecutionProvider"), times.placement
    assert times.numpy_ms is None and times.device_ms is None and times.capture_ms is None


def test_the_one_node_model_is_valid_onnx():
    import onnx

    case = _quick_case("group_normalization")
    attrs = bench.attributes_with_defaults(group_normalization, case)
    outputs = {"y": case.shapes["x"]}
    model, inputs, outputs, entry = bench_ort.single_node_model(group_normalization, case, attrs, outputs)
    onnx.checker.check_model(model, full_check=True)
    assert (entry.domain, entry.op_type) == ("ai.onnx", "GroupNormalization")
    assert inputs == ["X", "scale", "bias"] and outputs == ["Y"]
