"""One command on a GPU machine: the GPU test suite, then the GPU measurements, as one JSON file.

    python benchmarks/gpu_check.py              # one CUDA GPU; sized for < 9 minutes; results/gpu_check.json
    python benchmarks/gpu_check.py --dry-run    # the same code on the CPU at toy sizes (~30 s): checks the script

1. ``pytest tests/gpu`` in a subprocess: counts of passed / failed / skipped and the failures' names.
2. Tokens/s of a ~110M-parameter Hugging Face Llama in bf16 under ``StreamingDiLoCo`` (H = 30, P = 4,
   tau = 1, FP4 outer gradients) against a bare loop of the same model (``benchmarks/hf_throughput.py``,
   rounds alternating between the two); goal >= 0.95x.
3. FP4 (E3M0) encode and decode throughput on the GPU, in GB/s of FP32 values in (encode) or out (decode).
4. Memory against the analytic figure. A bare loop (DP's state on one replica) holds the parameters and
   AdamW's two moments: 3 units of the parameters' bytes. DiLoCo adds the global copy and the outer
   Nesterov momentum: 5 units, 5/3 of DP. Measured three ways for DP, Streaming and Streaming with
   ``offload_device="cpu"``: the bytes of the state tensors on the GPU (should be 5/3 and 1), CUDA's
   allocated memory once the gradients are freed, and CUDA's peak (activations and gradients
   included: Streaming's peak is reported against DP's peak plus the 2 extra units).

Without CUDA (and without ``--dry-run``) it says so and exits 0 having measured and written nothing.
Prints a summary and writes ``benchmarks/results/gpu_check.json`` (``gpu_check-dry-run.json``).
"""

import sys

from diloco.bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
