#!/usr/bin/env bash
# Issue 28 on one H200 machine, in one device call (bench/RESULTS.md). Run from the repository root with
# build/whl-stats carried (pydantic stack, exchange_calendars and its pure-Python needs); everything lands under $OUT.
#   bash bench/h200_issue28.sh TOTAL_SECONDS [stats] [SxTxD:FIRST_SEED:PANELS[:RESUME_JSONL] ...]
# stats: (1) the default statistics at 2,048 dims (30,000 rows, four protocols, 200 resamples, two-way interval,
# date-only baseline and market-neutral target), alone on the machine; (2) a torch-vs-numpy check at 128 dims.
# Then the interval study's two-way cells of that size on the host CPUs with the time left (seeds FIRST_SEED ..
# FIRST_SEED + PANELS - 1, appended to RESUME_JSONL's copy when given, so a later call goes on where it stopped).
# CAL_DEVICE=cuda CAL_WORKERS=N: the study's statistics on the GPU (torch backend, N processes sharing it).
# CAL_SCHEMES="two-way-held": the replicate sets to draw (default two-way; two-way-held with the two-way records of
# the same seeds gives the candidate two-way-adaptive, bench/calibration.py --summarise both files).
# CAL_PER_DECADE=K: the study's penalty grid with K values per decade (default 4, the spec's); CAL_SCENARIOS="a b": only these.
# CAL_CPU_JOB=SxTxD:FIRST_SEED:PANELS[:RESUME_JSONL]: one more cell at the same time on the host CPUs (numpy backend,
# CAL_CPU_WORKERS processes, default 11), for the whole call: the GPU cells of CAL_DEVICE=cuda leave the CPUs idle.
set -u
export PYTHONUNBUFFERED=1
total=${1:-420}; shift
if [ -n "${CAL_CPU_JOB:-}" ] && [ "${CAL_DEVICE:-cpu}" != cuda ]; then
  echo "CAL_CPU_JOB runs beside GPU cells: set CAL_DEVICE=cuda (or pass the CPU cell as an argument)" >&2; exit 2
fi
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
cell() {  # cell DEVICE WORKERS SxTxD:FIRST_SEED:PANELS[:RESUME_JSONL]
  local device=$1 workers=$2 size first panels resume out left mins
  IFS=: read -r size first panels resume <<< "$3"
  out="$OUT/calibration-$size-${CAL_SCHEMES:-two-way}-h200-$device-pd${CAL_PER_DECADE:-4}.jsonl"
  case "${resume:-}" in *.gz) out="$out.gz" ;; esac  # a gzip record file goes on as gzip (calibration.py reads both)
  [ -n "${resume:-}" ] && cp "$resume" "$out" && chmod u+w "$out"
  left=$(( total - ($(date +%s) - t0) - 25 ))
  [ "$left" -gt 40 ] || return 1
  mins=$(python3 -c "print(round(($left - 30) / 60, 2))")
  OPENBLAS_NUM_THREADS=1 timeout "$left" python3 bench/calibration.py --size "$size" --panels "$panels" \
    --first-seed "$first" --schemes ${CAL_SCHEMES:-two-way} --workers "$workers" --alphas-per-decade "${CAL_PER_DECADE:-4}" \
    ${CAL_SCENARIOS:+--scenarios $CAL_SCENARIOS} \
    --device "$device" --minutes "$mins" --out "$out" 2>&1 | tail -2
  python3 -c 'import sys; sys.path.insert(0, "bench"); from pathlib import Path; from calibration import read_records
print(len(read_records(Path(sys.argv[1]))), "records in", sys.argv[1])' "$out"
}
if [ -n "${CAL_CPU_JOB:-}" ]; then
  cell cpu "${CAL_CPU_WORKERS:-11}" "$CAL_CPU_JOB" > "$OUT/log-cpu-cell.txt" 2>&1 &
fi
for job in "$@"; do
  cell "${CAL_DEVICE:-cpu}" "${CAL_WORKERS:-16}" "$job" || break
done
wait
[ -n "${CAL_CPU_JOB:-}" ] && cat "$OUT/log-cpu-cell.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
