#!/usr/bin/env bash
# Issue 27 on one H200 machine, in one device call: the stages named, in order, everything under $OUT.
# Run from the repository root with build/gpu-kit and build/whl-stats (liger-kernel, pydantic) carried:
#   bash bench/h200_issue27.sh profile
# profile:    the reduced Qwen3.5-35B-A3B shape, pitlab's single-device path and FSDP2 forced at world size 1 with
#             the fused step, 6 timed steps each, then 2 steps under torch.profiler: wall vs device-busy time per
#             step, host calls, the top kernels (where FSDP2's 0.72 x goes; about 5 min).
# throughput: the acceptance command (plain loop, Liger, pitlab, FSDP2 fused) on the reduced shape, each pitlab run
#             then profiled for 2 steps (the GPU's idle share of a step) and every run's SM clock, power and
#             clock-event reasons sampled over its timed steps (about 9.5 min; THROUGHPUT_SHAPES=qwen3_30b_slice for
#             the other shape in its own call; THROUGHPUT_RUNS="hf;default" THROUGHPUT_BUDGET_S=330 for the ratio alone
#             in about 6 min; THROUGHPUT_ACCUMULATION=N for N microbatches per optimizer step, THROUGHPUT_PROFILE_STEPS=0
#             for no profile). Several shapes (THROUGHPUT_SHAPES=a,b) run one process each, the budget split between
#             them: on an H100, after a CUDA-graph run of the reduced shape, the process kept 7.2-7.7 GiB that the
#             Qwen3-30B slice (78-83 GB reserved alone) then lacked, even for the plain loop (2026-12-05).
# repeat:     FSDP2 forced at world size 1, two fresh 12-step runs of a 4-layer x 16-expert cut of the shape compared
#             step by step (bench/multigpu_qwen35.py --stages base,repeat): whether the GPU's own runs differ the
#             way the resumed 2-GPU run did (the 8 x 64 base stage alone took 274 s with its 35 GB checkpoint on
#             2026-12-04, so the repeat did not fit one call; about 5 min).
# accumulation: the reduced shape at 4, then 1 microbatch of 4,096 tokens per optimizer step: the single-device
#             path, then FSDP2 forced at world size 1 with the fused step, reduce-scattering once per step and after every
#             microbatch (whether FSDP2's fixed cost per step, about 44 ms of copies at 4,096 tokens, amortises;
#             about 8 min).
# fsdp2-ab:   the single-device path and FSDP2 forced at world size 1 (fused step), first from an older tree, then
#             from this one, each in its own process on the same machine (whether a commit slowed FSDP2: 0.68-0.77 x
#             the single-device path in four calls of 2026-12-03/04, 0.51-0.60 x in two of 2026-12-05). The older
#             tree is carried as OLD_TREE (default build/wt-5dc8285: `git archive 5dc8285 pitlab bench/throughput.py
#             bench/gpu_checks.py bench/h200_qwen35.py | tar -x -C build/wt-5dc8285`; about 7 min).
# fused-order: the plain loop, then pitlab with the update compiled per layer (grouped), on [n/16, 16] views and as by default,
#             in that order in one process, each profiled (whether the halved update of 2026-12-05 is the modes' or
#             the run order's; about 7 min); then `fused-modes` in the same call.
# fused-modes: bench/fused_step_modes.py, the fused update over the reduced shape's 141 parameters compiled each way
#             PITLAB_FUSED_STEP_SHAPES allows (dynamic, static, rows16, grouped): ms per step, TB/s, bit equality (about 3 min).
# compile-modes: the plain loop, pitlab's defaults and pitlab with its decoder layers compiled in mode
#             ${COMPILE_MODE:-reduce-overhead} (CUDA graphs: whether the host gaps of 14-38 % of the step close;
#             about 8 min), each profiled.
# cuda-graphs-check: bench/cuda_graphs_check.py on the 4-layer x 16-expert cut, 4 steps at 1 and 2 microbatches, torch's
#             default compile mode against reduce-overhead (CUDA graphs) under deterministic algorithms: whether
#             whole steps are bit-identical, which kernels.CUDA_GRAPHS_VERIFIED waits for (about 6-8 min on a fresh
#             machine: the first run compiles and autotunes everything; 215 s were not enough on 2026-12-05).
# copy-in:    FSDP2's reduce-scatter copy-in, pitlab's (pitlab.trainer.fsdp_copy_in) against torch's _chunk_cat:
#             tests/test_fsdp_copy_in.py with the GPU (the buffer against torch's CUDA kernel, bit for bit; the image's
#             pytest), then FSDP2 forced at world size 1 with torch's, pitlab's, torch's
#             and pitlab's copy-in, then the single-device path, in one process, each profiled (one call of
#             2026-12-06 gave +0.8 %, inside the steps' spread; about 7 min on a fresh machine).
# determinism: bench/determinism.py as measured on 2026-12-04 (which gradients differ between identical passes),
#             then with --deterministic (whether torch's deterministic algorithms make the step repeat; about 6 min);
# determinism-on: the --deterministic half alone (about 3 min).
# fsdp2-step: FSDP2 forced at world size 1 with torch's clipping + AdamW (FSDP2's default optimizer) and with the
#             fused step, beside the single-device path, 10 timed steps each in one process (whether the fused step
#             should become FSDP2's default on CUDA; about 5 min).
# autotune-ab: the single-device path in three processes on one machine, each with empty Triton and inductor
#             caches (every kernel compiled and autotuned again), 8 timed steps and 2 profiled ones each: whether the
#             1.4 x spread of its step time (96-148 ms in five calls of 2026-12-05, 127-139 ms and 96-100 ms in two
#             calls on one machine; the plain loop 133-160 ms) is the kernels a process compiles and picks, and which
#             kernels differ between a fast and a slow process (about 8 min; the first process also writes the model:
#             its 150 s limit of 2026-12-05 was too short for that).
# gather-ab:  the fused step's gathering of microbatch gradients (ComputeCopy.gather_grads: the first held, the second
#             summed with it in one compiled pass, the last read by the update): its CUDA test
#             (tests/test_single_device.py -k gathering_on_cuda: inductor's kernels against the stored sums), then
#             GATHER_ACCUM (default 4) microbatches per step from this tree (the plain loop beside it) and from OLD_TREE
#             (default build/wt-3f30228: `git archive 3f30228 pitlab bench/*.py | tar -x -C build/wt-3f30228`), each in
#             its own process and profiled for 2 steps (47 ms of a 357 ms step were the accumulation's cast and adds
#             on an H100 on 2026-12-06; about 6 min on a fresh machine).
# fsdp2-grads: FSDP2's accumulation and one-rank reduce (pitlab.trainer.fsdp_grads: the first two microbatches
#             summed in one compiled pass, the last added by the reduce-scatter copy-in, no one-rank output copy): the
#             CUDA tests of tests/test_fsdp_grads.py and tests/test_fsdp_copy_in.py, then in one process at
#             GATHER_ACCUM (default 4) microbatches per step the single-device path, FSDP2 forced at world size 1
#             with FSDP2's own gradient handling (PITLAB_FSDP_GRADS=torch) and with pitlab's, each profiled for 2
#             steps (about 7 min on a fresh machine).
# accept:     the acceptance call of issue 27: bench/throughput.py on both shapes (one process each), the plain loop,
#             Liger, pitlab's defaults and FSDP2 forced at world size 1 (fused step), no profile, ACCEPT_ACCUM (default
#             4) microbatches per optimizer step on the reduced shape and ACCEPT_SLICE_ACCUM (default 1) on the slice
#             (on an 80 GB H100 the slice needs activation checkpointing at 1 already, and 4 adds 4 bytes per
#             parameter of float32 sums; "1 4" runs the slice twice, each in its own process, into
#             accept-qwen3_30b_slice-a1 and -a4, and "1 4:hf;default" only those two runs at 4); then the bench's
#             own summary of each process (tokens/s, MFU, the ratios, timed steps max/min, peak allocated /
#             reserved against the plan), the runs skipped or failed, and at the end bench/accept_table.py's
#             markdown rows of every process, as bench/RESULTS.md takes them (7.5 min on a warm H100 on
#             2026-12-07). ACCEPT_SHAPES (default both) and ACCEPT_BUDGET_S (default 540:
#             each process may spend what is left of it less ACCEPT_RESERVE_S, default 150, for each process after
#             it) for one shape per call on a fresh machine, where compiling and autotuning
#             take most of the time (on a fresh H100 on 2026-12-07 the plain loop's first steps compiled fla for
#             97 s, pitlab's layers 82 s, FSDP2 after them 27 s); ACCEPT_RUNS (bench/throughput.py --runs) for
#             other runs. Liger runs last: its fused MoE kernel's first warm-up autotuned for 184 s at 16,384 tokens
#             per step (2026-12-07), and a budget spent on it had left no time for the pitlab runs. On a fresh
#             H100 at 07:05 that day the warm-ups took 166 s (plain loop), 113 s (pitlab) and 37 s (FSDP2), and
#             Liger's did not finish with about 185 s and 240 s left in two calls. Those Liger runs came after
#             pitlab's compiled runs, which (before 5ba39d0) left the process's Triton cache in inductor's folder,
#             so Liger tuned again there whatever an earlier process had tuned. On a fresh H100 at 08:31 the
#             reduced shape's four runs took 420 s in the order hf;liger;default;FSDP2 (warm-ups 86, 158, 83, 25 s),
#             and once the machine was warm a call of both shapes took 128-134 s.
#             TRITON_CACHE_AUTOTUNING=1 keeps each kernel's autotuning result on the machine for the next process
#             and call (fla's and Liger's kernels alike; the timed steps run after warm-up either way).
# cache-out:  Triton's autotuning results as $OUT/triton-autotune.tgz, to be carried into a later call as
#             build/tune-cache/ (see TUNE_CACHE below; inductor's cache, 17 MB and 43 MB compressed on 2026-12-07,
#             is over the 16 MB a returned file may have and would take the carried tree over 64 MiB): on a fresh
#             machine the warm-ups of one reduced-shape call took 166 + 113 + 37 s and Liger's did not finish in
#             240 s (2026-12-07); Liger's fused MoE kernels autotune 16 candidates each, keyed on the hidden and
#             expert sizes only.
# seeds-ab:   pitlab's default run of the reduced shape (one microbatch of 4,096 tokens, 2 warm-up and 4
#             timed steps) in two processes, each with empty Triton and inductor caches and
#             TRITON_CACHE_DIR unset, seeded from $TUNE_CACHE/seeds (a machine's own *.autotune.json files): first
#             from OLD_TREE (default build/wt-c6c20f9: `git archive c6c20f9 pitlab bench | tar -x -C
#             build/wt-c6c20f9 && rm -r build/wt-c6c20f9/bench/results`: the bench imports its sibling modules, and
#             the records would take the carried tree over 64 MiB), then from this tree, which pins TRITON_CACHE_DIR
#             before seeding (inductor moves every Triton kernel's cache to its own folder otherwise): the warm-up
#             of each and where the autotuning results were written (about 4 min on a fresh machine).
# fsdp2-spread: FSDP2 forced at world size 1 (fused step) on the reduced shape at 4 microbatches per step in
#             SPREAD_N (default 4) processes, the first with the single-device path before it, each profiled for 2
#             steps: tokens/s, timed steps, GPU power and clock, the host's load, and the profile's longest gaps,
#             so that a slow process (0.817 x the single-device path in one of four H100 calls on 2026-12-07, its
#             GPU drawing 576 against 653-655 W) shows where the GPU waited (about 6 min on a fresh machine).
# first-loss: bench/first_loss.py in four processes, inductor's cache cold (A), warm (A again), cold (B), cold (C):
#             the first-step loss of the 4-layer x 16-expert cut eager, with the compiled loss and with compiled
#             layers, each layer's output digest, and the Triton configurations inductor chose (issue 27 item 6:
#             whether the per-process first losses are inductor's autotuning; about 6 min on a fresh machine).
# resume-det: bench/multigpu_qwen35.py --deterministic on this one GPU, the 4-layer x 16-expert cut: 10 steps with
#             checkpoints at steps 5 and 10, then the run resumed from step 5, its losses, gradient norms and final
#             parameters against the uninterrupted run's (issue 27 item 6: whether training.deterministic makes a
#             resumed GPU run bit-identical; about 6 min on a fresh machine).
set -u
export PYTHONUNBUFFERED=1
cp build/whl-stats/*.whl build/gpu-kit/whl/ 2>/dev/null
source build/gpu-kit/device-env.sh build/gpu-kit || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD
t0=$(date +%s)
# Triton's autotuning results carried from an earlier call (TUNE_CACHE, default build/tune-cache, written by
# `cache-out`; fla's and Liger's kernels then do not time their candidates again). They shorten the warm-ups only;
# the timed steps run after the warm-up either way.
TRITON_CACHE=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
TUNE_CACHE=${TUNE_CACHE:-build/tune-cache}
if [ -f "$TUNE_CACHE/triton-autotune.tgz" ]; then
  mkdir -p "$TRITON_CACHE" && tar -xzf "$TUNE_CACHE/triton-autotune.tgz" -C "$TRITON_CACHE" --skip-old-files \
    && echo "caches: $TUNE_CACHE/triton-autotune.tgz into $TRITON_CACHE"
fi
FSDP2_FUSED='{"fusedOptimizer": true, "env": {"PITLAB_FORCE_FSDP2": "1"}}'
for stage in "$@"; do
  echo "== $stage at $(( $(date +%s) - t0 )) s"
  case $stage in
    profile) timeout 540 python3 bench/throughput.py --work /tmp/tp --out "$OUT/profile" --shapes qwen35_reduced \
               --checks "" --steps 6 --warmup 3 --profile-steps 2 --budget-s 520 --runs "default;$FSDP2_FUSED" \
               > "$OUT/profile.log" 2>&1
             python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['shapes']['qwen35_reduced']
for k, v in r.items():
    p = v.get('profile') if isinstance(v, dict) else None
    if p:
        print(k, round(v['tokens_per_second']), {a: b for a, b in p.items() if not a.startswith('top')})
        print('  top device time (ms/step, calls/step):', p['top_device_time'][:12])" "$OUT/profile/throughput.json" ;;
    throughput) shapes=${THROUGHPUT_SHAPES:-qwen35_reduced}; n=$(echo "$shapes" | tr ',' '\n' | wc -l)
                budget=$(( ${THROUGHPUT_BUDGET_S:-545} / n ))
                for shape in ${shapes//,/ }; do  # one process per shape: see the comment at the top
                  out=$OUT/throughput; [ "$n" -gt 1 ] && out=$OUT/throughput-$shape
                  timeout $(( budget + 25 )) python3 bench/throughput.py --work /tmp/tp --out "$out" \
                    --shapes "$shape" --checks "" --budget-s "$budget" --profile-steps "${THROUGHPUT_PROFILE_STEPS:-2}" \
                    --accumulation "${THROUGHPUT_ACCUMULATION:-1}" --runs "${THROUGHPUT_RUNS:-hf;liger;default;$FSDP2_FUSED}" > "$out.log" 2>&1
                  tail -8 "$out.log"
                done
                python3 -c "
import json, sys
for shape, e in (x for f in sys.argv[1:] for x in json.load(open(f))['shapes'].items()):
    for k, v in e.items():
        if isinstance(v, dict) and 'step_s' in v:
            p = v.get('profile') or {}
            print(shape, k[:40], round(v['tokens_per_second']), 'steps ms', [round(1000 * s) for s in v['step_s']],
                  'loss0', v.get('loss_first_last', [None])[0], 'gpu', v.get('gpu_state'),
                  'idle', p.get('device_idle_fraction'), 'launches', p.get('kernel_launches_per_step'))
            if p: print('  top:', [(n[:50], t, c) for n, t, c in p.get('top_device_time', [])[:12]])" \
                  "$OUT"/throughput*/throughput.json ;;
    fused-order) budget=${THROUGHPUT_BUDGET_S:-420}  # the in-model modes with the default last (2026-12-05 ran it first)
                 timeout $(( budget + 25 )) python3 bench/throughput.py --work /tmp/tp --out "$OUT/fused-order" \
                   --shapes qwen35_reduced --checks "" --budget-s "$budget" --profile-steps 2 \
                   --runs 'hf;{"env": {"PITLAB_FUSED_STEP_SHAPES": "grouped"}};{"env": {"PITLAB_FUSED_STEP_SHAPES": "rows16"}};default' \
                   > "$OUT/fused-order.log" 2>&1; tail -8 "$OUT/fused-order.log" ;;
    compile-modes) budget=${THROUGHPUT_BUDGET_S:-500}  # the decoder layers with CUDA graphs (PITLAB_COMPILE_MODE)
                 timeout $(( budget + 25 )) python3 bench/throughput.py --work /tmp/tp --out "$OUT/compile-modes" \
                   --shapes qwen35_reduced --checks "" --budget-s "$budget" --profile-steps 2 \
                   --runs "hf;default;{\"env\": {\"PITLAB_COMPILE_MODE\": \"${COMPILE_MODE:-reduce-overhead}\"}}" \
                   > "$OUT/compile-modes.log" 2>&1; tail -8 "$OUT/compile-modes.log" ;;
    fused-modes) timeout 300 python3 bench/fused_step_modes.py --out "$OUT/fused-modes/fused_step_modes.json" --modes "${FUSED_MODES:-dynamic,static,rows16,grouped}" \
                   > "$OUT/fused-modes.log" 2>&1; tail -6 "$OUT/fused-modes.log" ;;
    accumulation) K4='"gradientAccumulationSteps": 4'
                  timeout 570 python3 bench/throughput.py --work /tmp/tp --out "$OUT/accumulation" \
                    --shapes qwen35_reduced --checks "" --budget-s 545 --steps 8 --warmup 2 \
                    --runs "{$K4};{$K4, \"fusedOptimizer\": true, \"gradientSyncEveryMicrobatch\": false, \"env\": {\"PITLAB_FORCE_FSDP2\": \"1\"}};{$K4, \"fusedOptimizer\": true, \"env\": {\"PITLAB_FORCE_FSDP2\": \"1\"}};default;$FSDP2_FUSED" \
                    > "$OUT/accumulation.log" 2>&1; tail -8 "$OUT/accumulation.log" ;;
    fsdp2-ab) for tree in "${OLD_TREE:-build/wt-5dc8285}" .; do
                tag=$(basename "$(cd "$tree" && pwd)")
                (cd "$tree" && PYTHONPATH=$PYTHONPATH:$PWD timeout 280 python3 bench/throughput.py --work /tmp/tp-$tag \
                   --out "$OUT/fsdp2-ab-$tag" --shapes qwen35_reduced --checks "" --budget-s 260 --steps 10 --warmup 3 \
                   --runs "default;$FSDP2_FUSED" > "$OUT/fsdp2-ab-$tag.log" 2>&1; tail -4 "$OUT/fsdp2-ab-$tag.log")
              done ;;
    repeat) rm -rf /tmp/mg; PITLAB_FORCE_FSDP2=1 timeout 560 python3 bench/multigpu_qwen35.py --work /tmp/mg \
              --out "$OUT/repeat" --layers 4 --experts 16 --stages base,repeat --steps 12 \
              --final-checkpoint-only --budget-s 540 \
              > "$OUT/repeat.log" 2>&1
            python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
st = r.get('stages', {})
print('skipped', r.get('skipped'))
print({k: st.get('repeat', {}).get('against_base', {}).get(k) for k in ('first_step_differing', 'steps_differing', 'max_relative_difference')})" "$OUT/repeat/multigpu.json" ;;
    fsdp2-step) timeout 330 python3 bench/throughput.py --work /tmp/tp --out "$OUT/fsdp2-step" --shapes qwen35_reduced \
                  --checks "" --budget-s 310 --steps 10 --warmup 3 \
                  --runs "default;{\"fusedOptimizer\": false, \"env\": {\"PITLAB_FORCE_FSDP2\": \"1\"}};$FSDP2_FUSED" \
                  > "$OUT/fsdp2-step.log" 2>&1; tail -6 "$OUT/fsdp2-step.log" ;;
    autotune-ab) ab() {  # ab TAG LIMIT_S: one process with its own empty caches
                   rm -rf "/tmp/ab/tc$1" "/tmp/ab/ic$1"
                   TRITON_CACHE_DIR=/tmp/ab/tc$1 TORCHINDUCTOR_CACHE_DIR=/tmp/ab/ic$1 timeout "$2" python3 \
                     bench/throughput.py --work /tmp/tp --out "$OUT/autotune-ab-$1" --shapes qwen35_reduced --checks "" \
                     --budget-s $(( $2 - 10 )) --steps 8 --warmup 3 --profile-steps 2 --runs default \
                     > "$OUT/autotune-ab-$1.log" 2>&1
                   python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['shapes']['qwen35_reduced']['pitlab']
p = r.get('profile') or {}
print(sys.argv[2], round(r['tokens_per_second']), [round(1000 * s) for s in r['step_s']], 'warm-up', round(r['warmup_s']),
      'device busy ms/step', round(1000 * p.get('device_busy_s_per_step', 0)), 'idle', p.get('device_idle_fraction'),
      'launches', p.get('kernel_launches_per_step'), 'loss0', r['loss_first_last'][0], 'gpu', r.get('gpu_state'))
print('  top device time (ms/step, calls/step):', [(n[:60], t, c) for n, t, c in p.get('top_device_time', [])[:14]])" \
                     "$OUT/autotune-ab-$1/throughput.json" "$1" | tee -a "$OUT/autotune-ab.txt"
                   (cd "/tmp/ab/tc$1" 2>/dev/null && find . -name '*.autotune.json' | tar -czf "$OUT/autotune-ab-tc$1.tgz" -T -); }
                 ab 1 220; ab 2 170; ab 3 170 ;;
    cuda-graphs-check) timeout 560 python3 bench/cuda_graphs_check.py --work /tmp/cg --out "$OUT/cuda-graphs-check" \
                         --layers 4 --experts 16 --steps 4 --accumulation 1,2 > "$OUT/cuda-graphs-check.log" 2>&1
                       grep '^{' "$OUT/cuda-graphs-check.log" ;;
    determinism-on) timeout 200 python3 bench/determinism.py --out "$OUT/determinism--deterministic.json" \
                      --deterministic 2>&1 | grep -v Warn | tail -30 ;;
    determinism) for flag in "" --deterministic; do
                   timeout 270 python3 bench/determinism.py --out "$OUT/determinism${flag}.json" $flag 2>&1 \
                     | grep -v Warn | tail -30
                 done ;;
    copy-in) timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_fsdp_copy_in.py 2>&1 | tail -3
             TORCH_='{"env": {"PITLAB_FORCE_FSDP2": "1", "PITLAB_FSDP_COPY_IN": "torch"}}'
             OURS='{"env": {"PITLAB_FORCE_FSDP2": "1"}}'
             timeout ${THROUGHPUT_BUDGET_S:-450} python3 bench/throughput.py --work /tmp/tp --out "$OUT/copy-in" \
               --shapes qwen35_reduced --checks "" --steps 10 --warmup 3 --profile-steps 2 \
               --budget-s $(( ${THROUGHPUT_BUDGET_S:-450} - 25 )) --runs "$TORCH_;$OURS;$TORCH_;$OURS;default" \
               > "$OUT/copy-in.log" 2>&1
             grep -E "tokens/s|steps max/min|^qwen35_reduced  " "$OUT/copy-in.log" | tail -14 ;;
    fsdp2-grads) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_fsdp_grads.py tests/test_fsdp_copy_in.py \
                  2>&1 | tail -3
                F='"PITLAB_FORCE_FSDP2": "1"'
                timeout 420 python3 bench/throughput.py --work /tmp/tp --out "$OUT/fsdp2-grads" --shapes qwen35_reduced \
                  --checks "" --budget-s 400 --steps 8 --warmup 3 --profile-steps 2 --accumulation "${GATHER_ACCUM:-4}" \
                  --runs "default;{\"env\": {$F, \"PITLAB_FSDP_GRADS\": \"torch\"}};{\"env\": {$F}}" \
                  > "$OUT/fsdp2-grads.log" 2>&1
                tail -4 "$OUT/fsdp2-grads.log"
                python3 -c "
import json, sys
for k, v in json.load(open(sys.argv[1]))['shapes']['qwen35_reduced'].items():
    if isinstance(v, dict) and 'step_s' in v:
        p = v.get('profile') or {}
        print(k[:60], round(v['tokens_per_second']), 'steps ms', [round(1000 * s, 1) for s in v['step_s']],
              'loss0', v.get('loss_first_last', [None])[0], (v.get('kernels') or {}).get('fsdp_grads'),
              'busy ms', round(1000 * p.get('device_busy_s_per_step', 0), 1), 'idle', p.get('device_idle_fraction'))
        print('  top:', [(n[:40], t, c) for n, t, c in p.get('top_device_time', [])[:14]])" "$OUT/fsdp2-grads/throughput.json" ;;
    gather-ab) timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/test_single_device.py -k gathering_on_cuda \
                2>&1 | tail -6
              for tree in . "${OLD_TREE:-build/wt-3f30228}"; do
                tag=$(basename "$(cd "$tree" && pwd)"); runs=default; [ "$tree" = . ] && runs="hf;default"
                (cd "$tree" && PYTHONPATH=$PYTHONPATH:$PWD timeout 270 python3 bench/throughput.py --work /tmp/tp \
                   --out "$OUT/gather-ab-$tag" --shapes qwen35_reduced --checks "" --budget-s 255 --steps 8 --warmup 3 \
                   --profile-steps 2 --accumulation "${GATHER_ACCUM:-4}" --runs "$runs" > "$OUT/gather-ab-$tag.log" 2>&1
                 tail -4 "$OUT/gather-ab-$tag.log")
              done
              python3 -c "
import json, sys
for f in sys.argv[1:]:
    for shape, e in json.load(open(f))['shapes'].items():
        for k, v in e.items():
            if isinstance(v, dict) and 'step_s' in v:
                p = v.get('profile') or {}
                print(f.split('/')[-2], k[:30], round(v['tokens_per_second']), 'mfu', v.get('mfu'),
                      'steps ms', [round(1000 * s) for s in v['step_s']], 'peak', v.get('peak_allocated'),
                      v.get('peak_reserved'), 'plan', v.get('planned_peak'), 'loss', v.get('loss_first_last'))
                if p: print('  top:', [(n[:60], t, c) for n, t, c in p.get('top_device_time', [])[:14]])" \
                "$OUT"/gather-ab-*/throughput.json ;;
    accept) shapes=${ACCEPT_SHAPES:-qwen35_reduced,qwen3_30b_slice}
            procs=()  # one process per (shape, microbatches per step): see the comment at the top
            for shape in ${shapes//,/ }; do
              if [ "$shape" = qwen3_30b_slice ]; then accums=${ACCEPT_SLICE_ACCUM:-1}; else accums=${ACCEPT_ACCUM:-4}; fi
              for accum in $accums; do procs+=("$shape:$accum"); done
            done
            export TRITON_CACHE_AUTOTUNING=1  # a kernel's autotuning timed once per machine, not once per process
            slice_folders=$(( $(echo ${ACCEPT_SLICE_ACCUM:-1} | wc -w) > 1 ))  # the slice's folders name their count
            t_end=$(( SECONDS + ${ACCEPT_BUDGET_S:-540} )); left_procs=${#procs[@]}
            for proc in "${procs[@]}"; do
              shape=${proc%%:*}; accum=${proc#*:}; left_procs=$(( left_procs - 1 ))
              runs=${ACCEPT_RUNS:-hf;default;$FSDP2_FUSED;liger}
              [ "${accum#*:}" != "$accum" ] && { runs=${accum#*:}; accum=${accum%%:*}; }  # "4:hf;default"
              # this process may spend what is left less ACCEPT_RESERVE_S (default 150) for each one after it
              budget=$(( t_end - SECONDS - left_procs * ${ACCEPT_RESERVE_S:-150} ))
              name=accept-$shape; [ "$shape" = qwen3_30b_slice ] && [ "$slice_folders" = 1 ] && name=$name-a$accum
              [ "$budget" -lt 60 ] && { echo "$name: skipped ($budget s of ACCEPT_BUDGET_S left)"; continue; }
              log=$OUT/$name.log
              timeout $(( budget + 25 )) python3 bench/throughput.py --work /tmp/tp --out "$OUT/$name" \
                --shapes "$shape" --checks "" --budget-s "$budget" --profile-steps 0 --accumulation "$accum" \
                --runs "$runs" > "$log" 2>&1
              echo "== $name ($accum x 4,096-token microbatches per optimizer step)"
              sed -n '/^shape  /,$p' "$log"  # the bench's own summary: tokens/s, MFU, ratios, spread, memory vs plan
              grep -E ': skipped|"(skipped|error)": ' "$log" | cut -c1-300  # runs that did not run, and why
            done
            records=$(ls "$OUT"/accept-*/throughput.json 2>/dev/null)
            [ -n "$records" ] && python3 bench/accept_table.py $records ;;  # the rows bench/RESULTS.md takes
    fsdp2-spread) for i in $(seq 1 "${SPREAD_N:-4}"); do  # FSDP2's run-to-run spread, one process each
                    runs=$FSDP2_FUSED; limit=${SPREAD_LIMIT_S:-120}  # the first compiles for both paths
                    [ "$i" = 1 ] && { runs="default;$FSDP2_FUSED"; limit=${SPREAD_FIRST_LIMIT_S:-280}; }
                    timeout "$limit" python3 bench/throughput.py --work /tmp/tp --out "$OUT/spread-$i" \
                      --shapes qwen35_reduced --checks "" --accumulation 4 --profile-steps 2 \
                      --budget-s $(( limit - 20 )) --runs "$runs" > "$OUT/spread-$i.log" 2>&1
                    echo "== process $i at $(( $(date +%s) - t0 )) s"
                    python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print('host at start', d.get('host_at_start'))
for k, v in d['shapes']['qwen35_reduced'].items():
    if not isinstance(v, dict) or 'step_s' not in v: print(k, str(v)[:300]); continue
    g, p = v.get('gpu_state') or {}, v.get('profile') or {}
    gaps = p.get('idle_gaps') or {}
    print(k[:40], round(v['tokens_per_second']), 'steps ms', [round(1000 * s) for s in v['step_s']],
          'W', g.get('power_w_median'), 'MHz', g.get('sm_mhz_median'), 'host after', v.get('host_after'))
    print('  profiled: wall/step', p.get('wall_s_per_step'), 'busy/step', p.get('device_busy_s_per_step'),
          'gaps/step', gaps.get('gaps_per_step'), 'gap ms/step', gaps.get('gap_ms_per_step'), gaps.get('gap_ms_per_step_by_phase'))
    for gap in (gaps.get('longest') or [])[:4]:
        print('   gap', json.dumps({a: b for a, b in gap.items() if a != 'host'})[:330])
        print('     host meanwhile', [(h['name'][:50], round(h['us'])) for h in gap.get('host', [])][:8])" "$OUT/spread-$i/throughput.json"
                  done ;;
    first-loss) for run in a1 a2 b1 c1; do  # a2 reuses a1's cache
                  TORCHINDUCTOR_CACHE_DIR=/tmp/ind-${run%?} timeout 140 python3 bench/first_loss.py \
                    --out "$OUT/first-loss-$run.json" > "$OUT/first-loss-$run.log" 2>&1; tail -5 "$OUT/first-loss-$run.log"
                done ;;
    resume-det) timeout 560 python3 bench/multigpu_qwen35.py --work /tmp/mg --out "$OUT/resume-det" --layers 4 \
                  --experts 16 --stages base,resume --steps 10 --deterministic --budget-s 540 > "$OUT/resume-det.log" 2>&1
                python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for name, st in d['stages'].items():
    if 'error' in st: print(name, st['error'][:600]); continue
    print(name, 'tokens/s', round(st['tokens_per_second_total']), 'loss', st['loss'], 'deterministic',
          st['summary'].get('kernels', {}).get('deterministic'))
    if name == 'resume':
        print('resumed from', st['resumed_from_step'], 'parameters bit-identical', st['params_bit_identical_to_uninterrupted'],
              'of', st['params_total'], 'first step differing', st['against_base']['first_step_differing'],
              'compared', st['against_base']['steps_compared'])
print('skipped', d['skipped'])" "$OUT/resume-det/multigpu.json" || tail -30 "$OUT/resume-det.log" ;;
    cache-out) (cd "$TRITON_CACHE" 2>/dev/null && find . -name '*.autotune.json' | tar -czf "$OUT/triton-autotune.tgz" -T -)
               echo "caches: $(stat -c %s "$OUT/triton-autotune.tgz") B of autotuning results out" ;;
    seeds-ab) for tree in "${OLD_TREE:-build/wt-c6c20f9}" .; do  # one process each, its own empty caches
                tag=$(basename "$(cd "$tree" && pwd)"); rm -rf "/tmp/sa-$tag"
                (cd "$tree" && unset TRITON_CACHE_DIR TRITON_CACHE_AUTOTUNING && TRITON_HOME=/tmp/sa-$tag \
                   TORCHINDUCTOR_CACHE_DIR=/tmp/sa-$tag/inductor PITLAB_AUTOTUNE_SEEDS=$OLDPWD/$TUNE_CACHE/seeds \
                   timeout "${SEEDS_LIMIT_S:-200}" python3 bench/throughput.py --work /tmp/tp --out "$OUT/seeds-ab-$tag" \
                   --shapes qwen35_reduced --checks "" --budget-s $(( ${SEEDS_LIMIT_S:-200} - 10 )) --steps 4 --warmup 2 \
                   --runs default > "$OUT/seeds-ab-$tag.log" 2>&1)
                python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['shapes']['qwen35_reduced']['pitlab']
print(sys.argv[2], 'warm-up s', round(r['warmup_s'], 1), 'tokens/s', round(r['tokens_per_second']), 'loss', r['loss_first_last'])" \
                  "$OUT/seeds-ab-$tag/throughput.json" "$tag" || tail -5 "$OUT/seeds-ab-$tag.log"
                echo "  autotuning results: $(find /tmp/sa-$tag -name '*.autotune.json' | sed 's|/[^/]*/[^/]*$||' | sort | uniq -c | tr '\n' ' ')"
              done ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "== done at $(( $(date +%s) - t0 )) s"
