#!/usr/bin/env bash
# The statistics benchmark on one H200, in one device call (bench/RESULTS.md): 30,000 rows × 2,048 dims, all four
# protocols, 200 resamples, float64 on CUDA. Run from the repository root with the wheels of build/whl-stats
# carried (pydantic stack, exchange_calendars and its pure-Python needs); writes everything under $OUT.
#   bash bench/h200_statistics.sh
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  build/whl-stats/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import sys, torch, numpy, pandas, sklearn, exchange_calendars as x; print(sys.version.split()[0], torch.__version__, torch.version.cuda, numpy.__version__, pandas.__version__, sklearn.__version__, x.__version__, torch.cuda.get_device_name(0))' | tee "$OUT/versions.txt"
# 1. the target: penalty held at the point estimate's choice in replicates (bootstrap.reselectPenalty: false), twice
timeout 150 python3 bench/bench_statistics.py --dim 2048 --device cuda --no-reselect --repeat 2 \
  --out "$OUT/stats-h200-2048-fixed.json" 2>&1 | tee "$OUT/log-fixed.txt" | grep -v Warning
echo "step1 done at $(( $(date +%s) - t0 )) s"
# 2. the default (penalty chosen again in every replicate), 10 resamples: per-replicate cost, to extrapolate
left=$(( 270 - ($(date +%s) - t0) ))
[ "$left" -gt 30 ] && timeout $(( left - 25 )) python3 bench/bench_statistics.py --dim 2048 --device cuda --reselect \
  --resamples 10 --out "$OUT/stats-h200-2048-reselect10.json" 2>&1 | tee "$OUT/log-reselect10.txt" | grep -v Warning
echo "step2 done at $(( $(date +%s) - t0 )) s"
# 3. cross-device check: 384 dims, 10 resamples, default settings (compare with the CPU run of the same command)
left=$(( 285 - ($(date +%s) - t0) ))
[ "$left" -gt 15 ] && timeout "$left" python3 bench/bench_statistics.py --dim 384 --device cuda --resamples 10 \
  --out "$OUT/stats-h200-384-reselect10.json" 2>&1 | tee "$OUT/log-384.txt" | grep -v Warning
echo "all done at $(( $(date +%s) - t0 )) s"
