"""The README's Python blocks run as written, each on its own, from the repository root (on lavapipe in CI)."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)

RUNNER = """
import sys
for index, block in enumerate(sys.argv[1:]):
    exec(compile(block, f"README.md python block {index + 1}", "exec"), {"__name__": "__main__"})
"""


def test_every_python_block_of_the_readme_runs():
    blocks = BLOCK.findall((REPO / "README.md").read_text())
    assert len(blocks) >= 2
    env = dict(os.environ, WGPU_BACKEND_TYPE=os.environ.get("WGPU_BACKEND_TYPE", "Vulkan"))
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, *blocks],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "(2, 16, 8, 8) True" in result.stdout
