"""The public calls are typed: `mypy --strict` passes on a user script that uses every op.

mypy analyses the package the script imports but, with --follow-imports=silent, reports only the
script's own errors: the annotations of the calls it uses are what is checked.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import numpy as np

    from generated import Tensor, batch_normalization, group_normalization, instance_normalization, skip_group_norm

    x = np.ones((2, 4, 3, 3), np.float32)
    c = np.ones(4, np.float32)
    y1 = batch_normalization.batch_normalization(x, c, c, c, c, epsilon=1e-5)
    y2 = group_normalization.group_normalization(x, c, c, num_groups=2, epsilon=1e-6)
    y3 = instance_normalization.instance_normalization(Tensor.from_numpy(x), c, c)
    y4 = skip_group_norm.skip_group_norm(x, c, c, x, None, groups=2, activation=1, return_sum=True)
    outputs: dict[str, np.ndarray | Tensor] = group_normalization.kernel({"x": x, "scale": c, "bias": c}, attrs={"num_groups": 2})
    plan = group_normalization.plan({"x": x.shape, "scale": (4,), "bias": (4,)}, {"T": "float32"}, {"num_groups": 2})
    text: str = group_normalization.explain({"x": x.shape, "scale": (4,), "bias": (4,)}, {"T": "float32"}, {"num_groups": 2})
    print(y1.shape, y2.shape, y3.shape, len(outputs), plan.variant, text, type(y4))
    """
)


def test_mypy_strict_passes_on_a_user_script(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(script),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_catches_a_wrong_call(tmp_path):
    script = tmp_path / "wrong.py"
    script.write_text(
        "from generated import group_normalization\ngroup_normalization.group_normalization(1, 2, 3, num_groups='two')\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(script),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        proc.returncode == 1 and "num_groups" in proc.stdout and "incompatible type" in proc.stdout
    ), proc.stdout
