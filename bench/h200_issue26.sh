#!/usr/bin/env bash
# Issue 26 on one H200 machine, in one device call: the stages named, in order, everything under $OUT.
# Run from the repository root with build/gpu-kit and build/whl-stats carried:
#   bash bench/h200_issue26.sh check profile merge-shm stream-qwen
# check:       which embedding path is right (bench/profile_embed.py --pad-check: float64 reference kernels
#              against transformers' default bindings and the trainer's fla bindings, each prompt alone and in a
#              right-padded batch), fla's float32 compilation included (about 2 min).
# profile:     the embedding forward's variants, every batch shape warmed up before timing (about 3 min).
# merge-shm:   the merge with checkpoint and output in /dev/shm (the disk taken out; about 2 min).
# stream-qwen: 10.5 B qwen3_5_moe_text, layer-major against the resident model, 8 timed steps (about 5 min);
#              STREAM_ACCUM microbatches per step (default 4), STREAM_STEPS steps (default 10).
# eval-scale:  bench/eval_scale.py, the LeakageEval of two 35B-A3B-shape models end to end (about 6 min), with an
#              empty Triton cache (/tmp/eval-scale-triton) seeded from EVAL_SEEDS (default: pitlab's own seeds).
# kernel-cache: what the operator's storage.kernelCache saves: bench/eval_scale.py at 4 layers, 100 x 30, 20
#              resamples, twice in fresh processes and work folders sharing one new TRITON_CACHE_DIR and
#              TORCHINDUCTOR_CACHE_DIR (the first compiles and autotunes fla's kernels, the second finds them);
#              compare "embed base" of the two (about 4 min).
# autotune:    what pitlab's shipped Triton autotuning results save on a fresh machine: bench/eval_scale.py at 4
#              layers, 1000 x 30 (the full run's batch shapes), 20 resamples, three times in fresh processes, each
#              with a new empty Triton cache: "tune" with seeding off (Triton tunes every fla kernel; its
#              *.autotune.json files are exported to /tmp/autotune-seeds and $OUT/autotune-seeds.tgz), "seeded" with those
#              files as seeds,
#              "shipped" with the repository's pitlab/trainer/autotune_seeds; compare "embed base" (about 6 min).
# stats-cprofile: one model's statistics at eval_scale's shape with 20 resamples, timed, then again under cProfile
#              with CUDA_LAUNCH_BLOCKING=1 (every kernel waited for, so a function's cumulative time includes its
#              GPU work): which Python functions the GPU time goes to (about 2 min; torch.profiler over the
#              same run did not finish in 300 s, twice).
# stats-ab:    the statistics at eval_scale's shape (AB_RESAMPLES, default 100) with the evaluator of build/old-src
#              (a copy of an earlier tree's pitlab/ and bench/, carried) and then this tree's: wall times and
#              which reported numbers differ (about 3 min).
# stats-pair:  whether two processes' statistics share one GPU well: bench/bench_statistics.py at 2,048 dimensions,
#              1000 x 30 rows, four protocols, 100 resamples, alone and then two processes at once (about 3 min).
# cuda-tests:  the CUDA-only tests of the compiled embedding (tests/test_embed_scale.py -k gpu; pytest carried
#              in build/whl-stats; about 1 min).
# routing:     bench/profile_embed.py --routing-check: where transformers' default bindings and the trainer's
#              kernels part, layer by layer, and how many tokens' top-8 experts differ (about 2 min).
set -u
export PYTHONUNBUFFERED=1
cp build/whl-stats/*.whl build/gpu-kit/whl/ 2>/dev/null
source build/gpu-kit/device-env.sh build/gpu-kit || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD
git rev-parse HEAD 2>/dev/null > "$OUT/commit.txt"
t0=$(date +%s)
for stage in "$@"; do
  echo "== $stage at $(( $(date +%s) - t0 )) s"
  case $stage in
    check) timeout 300 python3 bench/profile_embed.py --out "$OUT/check" --layers 4 --experts 16 --pad-check 8 \
             2>&1 | grep -v Warning | tail -5 ;;
    profile) timeout 330 python3 bench/profile_embed.py --out "$OUT/profile" --layers 8 --experts 256 \
               --prompts 4096 --batch 512 --variants pad16,pad16+kernels 2>&1 | grep -v Warning | tail -40 ;;
    merge-shm) timeout 300 python3 bench/merge_speed.py --work /dev/shm/merge --max-shard-size 1GB --ranks 2 \
                 --json "$OUT/merge-speed-shm.json" > "$OUT/merge-shm.log" 2>&1; tail -8 "$OUT/merge-shm.log" ;;
    stream-qwen) timeout "${STREAM_TIMEOUT:-420}" python3 bench/streaming.py --model qwen35-moe --work /tmp/sq --out "$OUT/sq" \
                   --seq 2048 --micro 2 --accum "${STREAM_ACCUM:-4}" --steps "${STREAM_STEPS:-10}" --warmup 2 --baseline > "$OUT/sq.log" 2>&1
                 tail -2 "$OUT/sq.log" ;;
    eval-scale) rm -rf /tmp/eval-scale-triton; TRITON_CACHE_DIR=/tmp/eval-scale-triton PITLAB_AUTOTUNE_SEEDS="${EVAL_SEEDS-}" timeout 560 python3 bench/eval_scale.py --out "$OUT/eval-scale-h200.json" --workdir /tmp/eval-scale \
                  > "$OUT/eval-scale.log" 2>&1; grep -v Warning "$OUT/eval-scale.log" | tail -22 ;;
    kernel-cache) rm -rf /tmp/kc && for run in cold warm; do
                    TRITON_CACHE_DIR=/tmp/kc/triton TORCHINDUCTOR_CACHE_DIR=/tmp/kc/inductor timeout 240 \
                      python3 bench/eval_scale.py --layers 4 --panel-size 100x30 --resamples 20 \
                      --workdir "/tmp/kc-$run" --out "$OUT/kernel-cache-$run.json" > "$OUT/kernel-cache-$run.log" 2>&1
                    echo "$run:"; grep -E -A1 "^  embed base +[0-9.]+ s$" "$OUT/kernel-cache-$run.log"
                  done ;;
    autotune) for run in ${AUTOTUNE_RUNS:-tune seeded}; do
                rm -rf "/tmp/at-$run" && mkdir -p "/tmp/at-$run"
                case $run in tune) seeds=off ;; seeded) seeds=/tmp/autotune-seeds ;; shipped) seeds= ;; esac
                TRITON_CACHE_DIR="/tmp/at-$run/triton" PITLAB_AUTOTUNE_SEEDS="$seeds" timeout 200 \
                  python3 bench/eval_scale.py --layers 4 --panel-size 1000x30 --resamples 20 --workdir "/tmp/at-$run/w" \
                  --out "$OUT/autotune-$run.json" > "$OUT/autotune-$run.log" 2>&1
                [ $run = tune ] && python3 -c "import sys; from pitlab.trainer.autotune import export_autotune_results as e
print('exported', e(sys.argv[1], sys.argv[2]))" "/tmp/at-$run/triton" /tmp/autotune-seeds \
                  && tar -czf "$OUT/autotune-seeds.tgz" -C /tmp autotune-seeds
                echo "$run:"; grep -E -A1 "^  embed (base|twin) +[0-9.]+ s$" "$OUT/autotune-$run.log"
                grep -E "^  (total|statistics)" "$OUT/autotune-$run.log"
              done ;;
    stats-cprofile) args="--dim 2048 --device cuda --securities 1000 --dates 30 --resamples 20"
                    timeout 200 python3 bench/bench_statistics.py $args --out "$OUT/stats-20.json" > "$OUT/stats-20.log" 2>&1
                    CUDA_LAUNCH_BLOCKING=1 timeout 250 python3 -m cProfile -o "$OUT/stats-cprofile.prof" \
                      bench/bench_statistics.py $args --out "$OUT/stats-cprofile.json" > "$OUT/stats-cprofile.log" 2>&1
                    python3 -c "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(45)" \
                      "$OUT/stats-cprofile.prof" > "$OUT/stats-cprofile.txt" 2>&1; grep -E "wall|\"s\"" "$OUT/stats-20.log" | head -3 ;;
    stats-ab) args="--dim 2048 --device cuda --securities 1000 --dates 30 --resamples ${AB_RESAMPLES:-100}"
              for side in old new; do
                script=bench/bench_statistics.py; [ $side = old ] && script=build/old-src/bench/bench_statistics.py
                timeout 150 python3 $script $args --out "$OUT/stats-ab-$side.json" > "$OUT/stats-ab-$side.log" 2>&1
              done
              python3 -c "
import json, sys
a, b = (json.load(open(f'{sys.argv[1]}/stats-ab-{s}.json')) for s in ('old', 'new'))
skip = {'wall_s', 'load_average_1_5_15', 'timings', 'machine', 'versions', 'device'}
def leaves(x, path=''):
    if isinstance(x, dict):
        for k, v in x.items(): yield from leaves(v, f'{path}.{k}')
    elif isinstance(x, list):
        for i, v in enumerate(x): yield from leaves(v, f'{path}[{i}]')
    else: yield path, x
diff = [k for k in a if k not in skip and a[k] != b.get(k)]
la, lb = dict(leaves({k: a[k] for k in diff})), dict(leaves({k: b.get(k) for k in diff}))
num = [abs(la[p] - lb[p]) for p in la if isinstance(la[p], float) and isinstance(lb.get(p), float)]
other = [p for p in la if not (isinstance(la[p], float) and isinstance(lb.get(p), float)) and la[p] != lb.get(p)]
print('old', a['wall_s'], 'new', b['wall_s'], 'differing keys', diff, 'differing numbers', len(num),
      'max abs difference', max(num, default=0.0), 'other differences', other[:10])" "$OUT" ;;
    stats-pair) args="--dim 2048 --device cuda --securities 1000 --dates 30 --resamples 100"
                t1=$(date +%s.%N); timeout 150 python3 bench/bench_statistics.py $args --out "$OUT/stats-alone.json" \
                  > "$OUT/stats-alone.log" 2>&1; t2=$(date +%s.%N)
                for i in 1 2; do timeout 250 python3 bench/bench_statistics.py $args --out "$OUT/stats-pair-$i.json" \
                  > "$OUT/stats-pair-$i.log" 2>&1 & done; wait; t3=$(date +%s.%N)
                python3 -c "import sys; a,b,c=map(float,sys.argv[1:]); print(f'stats alone {b-a:.1f} s, two at once {c-b:.1f} s')" $t1 $t2 $t3
                tail -3 "$OUT/stats-alone.log" "$OUT/stats-pair-1.log" ;;
    cuda-tests) timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_embed_scale.py -k gpu -rs \
                  > "$OUT/cuda-tests.log" 2>&1; tail -5 "$OUT/cuda-tests.log" ;;
    routing) timeout 240 python3 bench/profile_embed.py --out "$OUT/routing" --layers 8 --experts 256 \
               --routing-check 256 2>&1 | grep -v Warning | tail -12 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "== done at $(( $(date +%s) - t0 )) s"
