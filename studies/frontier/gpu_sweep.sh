#!/bin/bash
# The frontier's GPU brackets (gpu_grids.py) in one call of a machine with one CUDA GPU:
#
#   OUT=DIR BUDGET=530 WORKERS=14 bash studies/frontier/gpu_sweep.sh
#   GRID_LIST=FILE OUT=DIR ... bash studies/frontier/gpu_sweep.sh   # the grids named in FILE (one path a line), in order
#                                                                    (e.g. studies/frontier/gpu-stage3-order.txt)
#
# Unpacks the corpus's token files (token_files.py wrote runs/frontier-tokens; train.bin travels as .xz), resumes
# from studies/frontier/results-gpu.jsonl (copied to DIR), sweeps every GPU grid in order of need with WORKERS
# runs at a time for at most BUDGET seconds (a run cut off there is lost; the sweep resumes the rest next time),
# and leaves in DIR: results-gpu.jsonl, sweep.log, gpu-util.log (nvidia-smi dmon) and gpu-runs.tgz (each run's
# metrics.jsonl and summary.json). Run from anywhere; python3 must hold torch with CUDA.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/frontier-gpu/out}
BUDGET=${BUDGET:-530}
WORKERS=${WORKERS:-14}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
$PY studies/frontier/token_files.py runs/frontier-tokens --check || exit 1
# resume from the committed records, unless DIR already holds a results file (never overwritten: it may hold more)
if [ -f "$OUT/results-gpu.jsonl" ]; then echo "resuming from $OUT/results-gpu.jsonl as it is"
elif [ -f studies/frontier/results-gpu.jsonl ]; then cp studies/frontier/results-gpu.jsonl "$OUT/results-gpu.jsonl"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | tail -n 2
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
(nvidia-smi dmon -s um -d 15 > "$OUT/gpu-util.log" 2>&1 &)
# the grid files are not in git: write every GPU grid that ran (grids.jsonl) to grids/gpu/ first
$PY studies/frontier/write_grids.py --files gpu/ > /dev/null || exit 1
if [ -n "${GRID_LIST:-}" ]; then grids=$(sed 's/^/--grid /' "$GRID_LIST"); else
    grids=$($PY studies/frontier/gpu_grids.py | sed 's/^/--grid /'); fi
start=$(date +%s)
timeout -s INT "$BUDGET" $PY -m diloco sweep $grids --out "$OUT/results-gpu.jsonl" --workers "$WORKERS" \
    --no-progress --retry-failed > "$OUT/sweep.log" 2>&1
echo "sweep exit $? after $(( $(date +%s) - start )) s"
pkill -f "nvidia-smi dmon" 2>/dev/null
tar czf "$OUT/gpu-runs.tgz" $(ls runs/frontier-gpu/*/*/metrics.jsonl runs/frontier-gpu/*/*/summary.json 2>/dev/null) 2>/dev/null
tail -n 5 "$OUT/sweep.log"
$PY - "$OUT/results-gpu.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    b = r["base"]
    print(r["status"], r["global_batch"], r["method"], b.get("codec", "-"), b.get("inner_optimizer", "adamw"),
          b.get("eager", False), r["inner_lr"], r.get("eval_loss"), round(r.get("wall_time_s") or 0),
          (r.get("error") or "")[-300:])
PY
