#!/usr/bin/env bash
# Issue 28 on one H200 machine, in one device call (bench/RESULTS.md): (1) the default statistics at 2,048 dims
# (30,000 rows, four protocols, 200 resamples, two-way interval, date-only baseline and market-neutral target),
# alone on the machine; (2) a torch-vs-numpy check at 128 dims; (3) the
# excess premium under a pure date effect (bench/excess_null.py, 200 panels); (4) the interval study's two-way cells on the host
# CPUs with the time left (held-out seeds from --first-seed). Run from the repository root with build/whl-stats
# carried (pydantic stack, exchange_calendars and its pure-Python needs); everything lands under $OUT.
#   bash bench/h200_issue28.sh TOTAL_SECONDS FIRST_SEED
set -u
export PYTHONUNBUFFERED=1
total=${1:-420}; first=${2:-5000}
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  build/whl-stats/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import sys, torch, numpy, scipy, sklearn; print(sys.version.split()[0], torch.__version__, numpy.__version__, scipy.__version__, sklearn.__version__, torch.cuda.get_device_name(0))' | tee "$OUT/versions.txt"
git rev-parse HEAD 2>/dev/null | tee "$OUT/commit.txt"
timeout 240 python3 bench/bench_statistics.py --dim 2048 --device cuda --repeat 1 \
  --out "$OUT/stats-h200-2048-two-way.json" 2>&1 | grep -v Warning | tee "$OUT/log-stats.txt"
echo "stats done at $(( $(date +%s) - t0 )) s"
timeout 90 python3 bench/bench_statistics.py --dim 128 --device cuda --resamples 20 --check numpy:128:20 \
  --out "$OUT/stats-h200-128-check.json" 2>&1 | grep -v Warning | grep check | tee "$OUT/log-check.txt"
echo "check done at $(( $(date +%s) - t0 )) s"
OPENBLAS_NUM_THREADS=1 timeout 150 python3 bench/excess_null.py --panels 200 --workers 16 \
  --out "$OUT/excess-null-two-way.jsonl" 2>&1 | tail -2
python3 bench/excess_null.py --summarise "$OUT/excess-null-two-way.jsonl" | tee "$OUT/excess-null-summary.json"
echo "excess done at $(( $(date +%s) - t0 )) s"
left=$(( total - ($(date +%s) - t0) - 25 ))
if [ "$left" -gt 40 ]; then
  mins=$(python3 -c "print(round(($left - 30) / 60, 2))")
  timeout "$left" python3 bench/calibration.py --size 300x30x8 --panels 2000 --first-seed "$first" --schemes two-way \
    --workers 16 --minutes "$mins" --out "$OUT/calibration-300x30x8-two-way-h200.jsonl" 2>&1 | tail -2
fi
echo "all done at $(( $(date +%s) - t0 )) s"
