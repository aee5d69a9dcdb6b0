#!/usr/bin/env bash
# One device call that measures what changed after the 2026-11-26 H100 run (issue 38):
# first the host's cost per dispatch (the meta arena MLX_GPU_META_ARENA, shared compute passes
# MLX_GPU_SHARED_PASSES, kept bind group layouts MLX_GPU_LAYOUT_CACHE: the reference f32 step with
# all on, each off, all off; gpu_dispatch_bench's microseconds per dispatch; the profile's host
# recording time with all on and all off), then
# chunked submission (MLX_GPU_CHUNKS) and split-K (MLX_GPU_SPLIT_K) switched on and off in
# the same call, the one-pass fused loss's GPU time per step, the split products in
# gpu_bench, the row kernels' own GPU time (MLX_PROFILE=1 gpu_bench), and f16 on the
# tensor cores (attention, the fused loss, matmuls) against MLX_GPU_COOPMAT=0, a step and the
# kernels. About 9 minutes; the parts run in order of what is newest, each packed as it ends.
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
# The recording switches: arena, shared passes, layout cache (1 1 1 is the default), alternated.
for m in 111 000 011 101 110 111 000; do
  a=${m:0:1} p=${m:1:1} l=${m:2:1}
  left && MLX_GPU_META_ARENA=$a MLX_GPU_SHARED_PASSES=$p MLX_GPU_LAYOUT_CACHE=$l timeout 100 \
    $B/mlx-llama "${R[@]}" --steps 10 --out /tmp/m$m --summary $g/ref_rec$m.json > $g/ref_rec$m.log 2>&1
  echo "arena $a passes $p layouts $l: $(tail -n 1 $g/ref_rec$m.log)"
done
left && timeout 60 $B/gpu_dispatch_bench > $g/dispatch_bench.log 2>&1; tail -n 6 $g/dispatch_bench.log
for m in 111 000; do # host time to record a step's GPU work (profiled: timed passes are their own)
  a=${m:0:1} p=${m:1:1} l=${m:2:1}
  left && MLX_PROFILE=1 MLX_GPU_META_ARENA=$a MLX_GPU_SHARED_PASSES=$p MLX_GPU_LAYOUT_CACHE=$l \
    timeout 100 $B/mlx-llama "${R[@]}" --steps 4 --out /tmp/q$m > $g/prof_rec$m.log 2>&1
  echo "profiled $m: $(grep -m1 "primitive time on the CPU" $g/prof_rec$m.log)"
done
pack
for c in 1 0; do # f16 through the tensor cores, and the f32-compute kernels (MLX_GPU_COOPMAT=0)
  left && MLX_GPU_COOPMAT=$c timeout 150 $B/mlx-llama "${R[@]/f32/f16}" --steps 10 --out /tmp/h$c \
    --summary $g/ref_f16_coop$c.json > $g/ref_f16_coop$c.log 2>&1
  tail -n 1 $g/ref_f16_coop$c.log
  left && MLX_GPU_COOPMAT=$c timeout 120 $B/gpu_bench --dtype f16 > $g/ops_f16_coop$c.log 2>&1
  grep -iE "attention|logits|dX|dW" $g/ops_f16_coop$c.log | head -8
done
pack
for c in 1 0 1 0; do # chunked submission on and off, alternated
  left && MLX_GPU_CHUNKS=$c timeout 120 $B/mlx-llama "${R[@]}" --steps 10 --out /tmp/r$c \
    --summary $g/ref_chunks$c.json > $g/ref_chunks$c.log 2>&1
  tail -n 1 $g/ref_chunks$c.log
done
pack
for k in 1 0; do # split-K on and off: the step, then the loss's GPU time per step
  left && MLX_GPU_SPLIT_K=$k timeout 120 $B/mlx-llama "${R[@]}" --steps 10 --out /tmp/s$k \
    --summary $g/ref_split$k.json > $g/ref_split$k.log 2>&1
  tail -n 1 $g/ref_split$k.log
  left && MLX_PROFILE=1 MLX_GPU_SPLIT_K=$k timeout 120 $B/mlx-llama "${R[@]}" --steps 4 \
    --out /tmp/p$k > $g/prof_split$k.log 2>&1
  grep -E "^  (linear_cross_entropy|matmul)" $g/prof_split$k.log | head -6
done
pack
for k in 1 0; do
  left && MLX_GPU_SPLIT_K=$k timeout 100 $B/gpu_bench --dtype f32 > $g/ops_split$k.log 2>&1
  grep -E "dX|dW|logits" $g/ops_split$k.log
done
left && MLX_PROFILE=1 timeout 150 $B/gpu_bench --dtype f32 > $g/bench_profiled.log 2>&1
grep -E "GB/s|^  (sum|softmax) " $g/bench_profiled.log
pack; echo packed
