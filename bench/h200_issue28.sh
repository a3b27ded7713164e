#!/usr/bin/env bash
# Issue 28 on one H200 machine, in one device call (bench/RESULTS.md). Run from the repository root with
# build/whl-stats carried (pydantic stack, exchange_calendars and its pure-Python needs); everything lands under $OUT.
#   bash bench/h200_issue28.sh TOTAL_SECONDS [stats] [SxTxD:FIRST_SEED:PANELS[:RESUME_JSONL]]
# stats: (1) the default statistics at 2,048 dims (30,000 rows, four protocols, 200 resamples, two-way interval,
# date-only baseline and market-neutral target), alone on the machine; (2) a torch-vs-numpy check at 128 dims.
# Then the interval study's two-way cells of that size on the host CPUs with the time left (seeds FIRST_SEED ..
# FIRST_SEED + PANELS - 1, appended to RESUME_JSONL's copy when given, so a later call goes on where it stopped).
# CAL_DEVICE=cuda CAL_WORKERS=N: the study's statistics on the GPU (torch backend, N processes sharing it).
# CAL_PER_DECADE=K: the study's penalty grid with K values per decade (default 4, the spec's); CAL_SCENARIOS="a b": only these.
set -u
export PYTHONUNBUFFERED=1
total=${1:-420}; shift
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  build/whl-stats/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import sys, torch, numpy, scipy, sklearn; print(sys.version.split()[0], torch.__version__, numpy.__version__, scipy.__version__, sklearn.__version__, torch.cuda.get_device_name(0))' | tee "$OUT/versions.txt"
git rev-parse HEAD 2>/dev/null | tee "$OUT/commit.txt"
if [ "${1:-}" = stats ]; then
  shift
  spy=""  # a sampling profile of the run when build/whl-spy (py-spy) was carried
  if ls build/whl-spy/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy build/whl-spy/*.whl \
      && spy="/tmp/spy/bin/py-spy record -r 10 -f raw --threads --nonblocking -o $OUT/spy-2048.txt --"
  fi
  timeout 240 $spy python3 bench/bench_statistics.py --dim 2048 --device cuda --repeat 1 \
    --out "$OUT/stats-h200-2048-two-way.json" 2>&1 | grep -v Warning | tee "$OUT/log-stats.txt"
  echo "stats done at $(( $(date +%s) - t0 )) s"
  timeout 90 python3 bench/bench_statistics.py --dim 128 --device cuda --resamples 20 --check numpy:128:20 \
    --out "$OUT/stats-h200-128-check.json" 2>&1 | grep -v Warning | grep check | tee "$OUT/log-check.txt"
  echo "check done at $(( $(date +%s) - t0 )) s"
fi
for job in "$@"; do
  IFS=: read -r size first panels resume <<< "$job"
  out="$OUT/calibration-$size-two-way-h200${CAL_DEVICE:+-$CAL_DEVICE}${CAL_PER_DECADE:+-pd$CAL_PER_DECADE}.jsonl"
  [ -n "${resume:-}" ] && cp "$resume" "$out"
  left=$(( total - ($(date +%s) - t0) - 25 ))
  [ "$left" -gt 40 ] || break
  mins=$(python3 -c "print(round(($left - 30) / 60, 2))")
  OPENBLAS_NUM_THREADS=1 timeout "$left" python3 bench/calibration.py --size "$size" --panels "$panels" \
    --first-seed "$first" --schemes two-way --workers "${CAL_WORKERS:-16}" --alphas-per-decade "${CAL_PER_DECADE:-4}" \
    ${CAL_SCENARIOS:+--scenarios $CAL_SCENARIOS} \
    --device "${CAL_DEVICE:-cpu}" --minutes "$mins" --out "$out" 2>&1 | tail -2
  wc -l "$out"
done
echo "all done at $(( $(date +%s) - t0 )) s"
