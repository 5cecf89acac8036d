"""`webgpu_norm_kernels` in the editable install only (`pip install -e .`, pyproject.toml's `dev-mode-dirs`).

The wheel installs generated/ under this name, and its `webgpu-norm-kernels` command runs
`webgpu_norm_kernels.__main__:main`. hatchling's editable install puts folders on sys.path and
cannot rename one, so this package stands in for that command alone: its __main__ runs generated/'s.
In the repository the kernels are `generated` (`from generated import batch_normalization`); this
package has none of them, so that one process never holds two copies of the same modules.
"""
