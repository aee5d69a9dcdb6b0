#!/usr/bin/env bash
# One device call that measures what changed since the last H100 run (issue 38), each
# change switched on and off in the same call, newest first (the budget cuts the end):
#   1. overlapped steps (`--no-overlap-steps` waits for each step's loss before building the
#      next): the reference f32 step, alternated;
#   2. the host's cost per dispatch: the meta arena (MLX_GPU_META_ARENA), shared compute
#      passes (MLX_GPU_SHARED_PASSES), kept bind group layouts (MLX_GPU_LAYOUT_CACHE): the
#      reference f32 step with all on, each off, all off; gpu_dispatch_bench's microseconds
#      per dispatch; the profile's host recording time with all on and all off;
#   3. overlapped steps on the large model and in f16;
#   4. f16 and bf16 row kernels as quads (gpu_bench's memory-bound table, f16 and bf16);
#   5. the per-primitive GPU time of a reference f32 and f16 step (MLX_PROFILE=1);
#   6. split-K on and off in gpu_bench (the standalone dX product ran 2.2x slower with it
#      on 2026-11-27, while the step gained: which products lose).
# Here: bench/gpu.sh pack; there (carry .gpu-bin and .gl): BUDGET=480 bash bench/gpu_ab.sh
# Logs go to $OUT (all.tgz after each part).
set -u
g=/tmp/gab; mkdir -p $g
end=$((SECONDS + ${BUDGET:-480}))
left() { [ $SECONDS -lt $end ]; }
pack() { tar czf $OUT/all.tgz -C $g . ; }
bench/gpu.sh vulkan
B=.gpu-bin
R=(train --eval-every 0 --data offline --device gpu --global-batch 4 --block-size 512 --fresh --dtype f32)
L=(--layers 12 --dims 768 --heads 12 --mlp-dims 2048 --global-batch 16)
step() { # name, timeout, args...: one run, its last three step times shown
  local name=$1 t=$2; shift 2
  left && timeout "$t" $B/mlx-llama "$@" --out /tmp/$name --summary $g/$name.json > $g/$name.log 2>&1
  echo "$name: $(grep -o 'ms_per_step=[0-9.]*' $g/$name.log | tail -n 3 | tr '\n' ' ')"
  rm -rf /tmp/$name
}
no_overlap() { [ "$1" = 0 ] && echo --no-overlap-steps; }
for o in 1 0 1 0; do # 1: overlapped (the default), 0: --no-overlap-steps
  step ref_overlap${o}_$SECONDS 120 "${R[@]}" --steps 12 $(no_overlap $o)
done
pack
# The recording switches: arena, shared passes, layout cache (1 1 1 is the default), alternated.
for m in 111 000 011 101 110 111 000; do
  export MLX_GPU_META_ARENA=${m:0:1} MLX_GPU_SHARED_PASSES=${m:1:1} MLX_GPU_LAYOUT_CACHE=${m:2:1}
  step ref_rec${m}_$SECONDS 100 "${R[@]}" --steps 10
done
unset MLX_GPU_META_ARENA MLX_GPU_SHARED_PASSES MLX_GPU_LAYOUT_CACHE
left && timeout 60 $B/gpu_dispatch_bench > $g/dispatch_bench.log 2>&1; tail -n 6 $g/dispatch_bench.log
for m in 111 000; do # host time to record a step's GPU work (profiled: timed passes are their own)
  left && MLX_PROFILE=1 MLX_GPU_META_ARENA=${m:0:1} MLX_GPU_SHARED_PASSES=${m:1:1} \
    MLX_GPU_LAYOUT_CACHE=${m:2:1} timeout 100 $B/mlx-llama "${R[@]}" --steps 4 --out /tmp/q$m \
    > $g/prof_rec$m.log 2>&1
  echo "profiled $m: $(grep -m1 "primitive time on the CPU" $g/prof_rec$m.log)"
  rm -rf /tmp/q$m
done
pack
for o in 1 0; do
  step large_overlap$o 200 "${R[@]}" "${L[@]}" --steps 6 $(no_overlap $o)
  step ref_f16_overlap$o 150 "${R[@]/f32/f16}" --steps 12 $(no_overlap $o)
done
pack
for d in f16 bf16; do # the row kernels: sum and softmax as quads (was 233 / 223 GB/s in f16)
  left && timeout 150 $B/gpu_bench --dtype $d > $g/ops_$d.log 2>&1
  grep -E "GB/s" $g/ops_$d.log
done
pack
for d in f32 f16; do # where a step's GPU time goes now
  left && MLX_PROFILE=1 timeout 150 $B/mlx-llama "${R[@]/f32/$d}" --steps 4 --out /tmp/p$d \
    > $g/prof_$d.log 2>&1
  grep -A12 "GPU execution time" $g/prof_$d.log | head -12
  rm -rf /tmp/p$d
done
pack
for k in 1 0; do
  left && MLX_GPU_SPLIT_K=$k timeout 100 $B/gpu_bench --dtype f32 > $g/ops_split$k.log 2>&1
  grep -E "dX|dW|logits" $g/ops_split$k.log
done
pack; echo packed
