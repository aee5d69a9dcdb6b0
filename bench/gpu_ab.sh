#!/usr/bin/env bash
# One device call that measures what changed since the last H100 run (issue 38), each
# change switched on and off in the same call, most important first (the budget cuts the
# end; $OUT/all.tgz is rewritten after each part, so a cut call still brings back the rest):
#   1. overlapped steps (`--no-overlap-steps` waits for each step's loss before building the
#      next), alternated: the reference f32 step, then f16 (whose loss-scale decision now
#      stays on the GPU, so it overlaps too) and the large f32 model;
#   2. where a step's GPU time goes now (MLX_PROFILE=1), f32 and f16, and the large f32 model;
#   3. matmul (gpu_bench --only matmul, f32 and f16): vectorised staging loads on and off
#      (MLX_GPU_VEC_LOADS), split-K off, the tensor-core kernel's 128 x 128 tiles on 8
#      subgroups of 32 x 64 (MLX_GPU_COOP_SUBGROUPS=8; the default is 4 of 64 x 64, not yet
#      measured), wgpu's runtime checks off (MLX_GPU_CHECKED=0; also
#      the reference f32 step, alternated), and the split-K wave (MLX_GPU_SPLIT_WAVE, the
#      workgroups one wave holds; 528 is the design figure, 4 per SM) at 264, 792 and 1056;
#   4. attention (gpu_bench --only attention, f32) at each of the f32 kernels' tiles
#      (MLX_GPU_ATTENTION_TILES), the default first;
#   5. the host's cost per dispatch: the meta arena, shared compute passes and kept bind
#      group layouts all on and all off (reference f32 step, gpu_dispatch_bench);
#   6. memory-bound kernels (gpu_bench --only memory): f32 elementwise with 4 quads per
#      invocation, row sums and softmax in unrolled rounds; f16 and bf16 row kernels as quads.
# Here: bench/gpu.sh pack; there (carry .gpu-bin and .gl): BUDGET=480 bash bench/gpu_ab.sh
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
for o in 1 0; do
  step ref_f16_overlap$o 150 "${R[@]/f32/f16}" --steps 12 $(no_overlap $o)
done
pack
for o in 1 0; do
  step large_overlap$o 200 "${R[@]}" "${L[@]}" --steps 6 $(no_overlap $o)
done
pack
for d in f32 f16; do # where a step's GPU time goes now
  left && MLX_PROFILE=1 timeout 150 $B/mlx-llama "${R[@]/f32/$d}" --steps 4 --out /tmp/p$d \
    > $g/prof_$d.log 2>&1
  grep -A12 "GPU execution time" $g/prof_$d.log | head -12
  rm -rf /tmp/p$d
done
# The large model's (last profiled on 2026-11-26, before most kernels were rewritten).
left && MLX_PROFILE=1 timeout 200 $B/mlx-llama "${R[@]}" "${L[@]}" --steps 3 --out /tmp/plarge \
  > $g/prof_large_f32.log 2>&1
grep -A16 "GPU execution time" $g/prof_large_f32.log | head -16
rm -rf /tmp/plarge
pack
mm() { # name, then VAR=value settings: gpu_bench's matmul table in f32 and f16
  local name=$1; shift
  for d in f32 f16; do
    left && env "$@" timeout 100 $B/gpu_bench --dtype $d --only matmul > $g/mm_${name}_$d.log 2>&1
    echo "$name $d:"; grep -E "GFLOP" $g/mm_${name}_$d.log
  done
}
mm default
mm vec0 MLX_GPU_VEC_LOADS=0
mm split0 MLX_GPU_SPLIT_K=0
mm unchecked MLX_GPU_CHECKED=0
mm sg8 MLX_GPU_COOP_SUBGROUPS=8
pack
for c in 0 1 0 1; do # wgpu's runtime checks off and on (f32 kernels only; f16 ones still need them)
  MLX_GPU_CHECKED=$c step ref_checked${c}_$SECONDS 100 "${R[@]}" --steps 10
done
pack
for w in 264 792 1056; do mm wave$w MLX_GPU_SPLIT_WAVE=$w; done
pack
for t in auto 64x32 32x32 32x16 16x16; do
  left && MLX_GPU_ATTENTION_TILES=$t timeout 100 $B/gpu_bench --dtype f32 --only attention \
    > $g/att_$t.log 2>&1
  echo "tiles $t:"; grep -E "^attention" $g/att_$t.log
done
pack
for m in 111 000 111 000; do # arena, shared passes, layout cache
  export MLX_GPU_META_ARENA=${m:0:1} MLX_GPU_SHARED_PASSES=${m:1:1} MLX_GPU_LAYOUT_CACHE=${m:2:1}
  step ref_rec${m}_$SECONDS 100 "${R[@]}" --steps 10
done
unset MLX_GPU_META_ARENA MLX_GPU_SHARED_PASSES MLX_GPU_LAYOUT_CACHE
left && timeout 60 $B/gpu_dispatch_bench > $g/dispatch_bench.log 2>&1; tail -n 6 $g/dispatch_bench.log
pack
for d in f32 f16 bf16; do # memory-bound kernels: f32 elementwise 4 quads an invocation and rows in
  # unrolled rounds (were 1,316-1,852 and 847-956 GB/s); f16 rows as quads (were 233 / 223)
  left && timeout 150 $B/gpu_bench --dtype $d --only memory > $g/ops_$d.log 2>&1
  grep -E "GB/s" $g/ops_$d.log
done
pack; echo packed
