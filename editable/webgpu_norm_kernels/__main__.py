"""`webgpu-norm-kernels COMMAND` in the editable install: runs `python -m generated COMMAND`."""

import sys

from generated.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
