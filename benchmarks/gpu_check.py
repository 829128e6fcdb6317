"""One command on a GPU machine: the GPU test suite, then the GPU measurements, as one JSON file
(what it runs and measures: :mod:`diloco.bench.gpu_check`).

    python benchmarks/gpu_check.py              # one CUDA GPU; sized for < 9 minutes; results/gpu_check.json
    python benchmarks/gpu_check.py --dry-run    # the same code on the CPU at toy sizes (~30 s): checks the script
"""

import sys

from diloco.bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
