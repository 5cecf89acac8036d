"""check_model on real exports: every normalization node of small diffusers UNet and VAE decoder,
torchvision ResNet, fast-neural-style, BERT and Llama models runs through the kernels within tolerance
of float64.

The files in tests/data/models/ are written by `scripts/export_models.py` (torch, diffusers,
transformers and ONNX Runtime's optimizer; none of them a test dependency): legacy and dynamo
exports, the ONNX Runtime-optimized forms its Stable Diffusion and transformer pipelines run, float32
and float16.
"""

import io
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from generated import check_model, ops  # noqa: E402

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"


def _normalization_nodes(model):
    family = check_model.normalization_ops()
    return [n for n in model.graph.node if ((n.domain or "ai.onnx"), n.op_type) in family]


def _runnable(node):
    return any(
        entry.domain == (node.domain or "ai.onnx") and entry.op_type == node.op_type
        for entry in ops().values()
    )


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.onnx")), ids=lambda p: p.stem)
def test_every_normalization_node_of_a_real_export_runs_within_tolerance(path, device):
    model = onnx.load(str(path))
    nodes = _normalization_nodes(model)
    assert nodes, f"{path.name} holds no normalization node: the export changed"
    lines = io.StringIO()
    summary = check_model.check(model, seed=0, device=device, out=lines)
    report = lines.getvalue()
    assert summary.failed == 0, report
    assert summary.ran + summary.skipped == len(nodes), report
    # The only nodes left out are of ops the package has no kernel for; every one of those says so.
    expected_skips = [n for n in nodes if not _runnable(n)]
    assert summary.skipped == len(expected_skips), report
    assert report.count("skipped: no kernel for") == len(expected_skips), report
