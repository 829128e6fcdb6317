#!/bin/bash
# The outer-steps study (grids.py) in one call of a machine with one CUDA GPU:
#
#   OUT=DIR BUDGET=540 WORKERS=16 bash studies/outer-steps/gpu_sweep.sh
#   STAGES=4 STAGE2_MIN=0 OUT=DIR BUDGET=230 WORKERS=18 bash studies/outer-steps/gpu_sweep.sh   # the fourth stage
#
# Unpacks the corpus's token files (studies/frontier/token_files.py wrote runs/frontier-tokens), resumes from
# studies/outer-steps/results-gpu.jsonl (copied to DIR unless DIR holds one), and runs the three stages of
# grids.py in turn, each written from the records before it, within BUDGET seconds in all (a run cut off at the
# budget is lost; the sweep resumes the rest next time). Stage 1 may use all but STAGE2_MIN seconds; a stage
# starts only if at least MIN_STAGE seconds are left. Leaves in DIR: results-gpu.jsonl, sweep-N.log, gpu-util.log,
# gpu-runs.tgz (each run's metrics.jsonl and summary.json). python3 must hold torch with CUDA.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/outer-steps-gpu/out}
BUDGET=${BUDGET:-540}
WORKERS=${WORKERS:-16}
STAGE2_MIN=${STAGE2_MIN:-170}
MIN_STAGE=${MIN_STAGE:-100}
PY=${PY:-python3}
HERE=studies/outer-steps
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
start=$(date +%s)
$PY studies/frontier/token_files.py runs/frontier-tokens --check || exit 1
if [ -f "$OUT/results-gpu.jsonl" ]; then echo "resuming from $OUT/results-gpu.jsonl as it is"
elif [ -f $HERE/results-gpu.jsonl ]; then cp $HERE/results-gpu.jsonl "$OUT/results-gpu.jsonl"; fi
touch "$OUT/results-gpu.jsonl"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tail -n 1
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
(nvidia-smi dmon -s um -d 15 > "$OUT/gpu-util.log" 2>&1 &)
for stage in ${STAGES:-1 2 3}; do
    left=$(( BUDGET - ($(date +%s) - start) ))
    [ "$stage" = 1 ] && [ "${STAGES:-1 2 3}" != 1 ] && left=$(( left - STAGE2_MIN ))
    if [ "$left" -lt "$MIN_STAGE" ]; then echo "stage $stage not started: $left s left"; break; fi
    grids=$($PY $HERE/grids.py $stage "$OUT/results-gpu.jsonl" | sed 's/^/--grid /')
    if [ -z "$grids" ]; then echo "stage $stage: nothing to run"; continue; fi
    echo "stage $stage: $(echo "$grids" | wc -l) grids, $left s"
    timeout -s INT "$left" $PY -m diloco sweep $grids --out "$OUT/results-gpu.jsonl" --workers "$WORKERS" \
        --no-progress --retry-failed > "$OUT/sweep-$stage.log" 2>&1
    echo "stage $stage: sweep exit $? at $(( $(date +%s) - start )) s"
    tail -n 3 "$OUT/sweep-$stage.log"
done
pkill -f "nvidia-smi dmon" 2>/dev/null
cp -r $HERE/grids "$OUT/" 2>/dev/null; tar czf "$OUT/grids.tgz" -C $HERE grids; rm -rf "$OUT/grids"
tar czf "$OUT/gpu-runs.tgz" $(ls runs/outer-steps-gpu/*/*/metrics.jsonl runs/outer-steps-gpu/*/*/summary.json 2>/dev/null) 2>/dev/null
$PY - "$OUT/results-gpu.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    b = r["base"]
    print(r["status"], r["global_batch"], r["method"], r["sync_every"], b.get("outer_momentum"), r["outer_lr"],
          r.get("seed"), r.get("eval_loss"), round(r.get("wall_time_s") or 0), (r.get("error") or "")[-200:])
PY
