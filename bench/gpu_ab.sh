#!/usr/bin/env bash
# One device call that checks the new kernels on the card (part 0), then measures issue 38's
# goals on it, ours beside PyTorch in the same
# call (the last card, an H200, ran ours alone: every ratio then leaned on the H100's PyTorch),
# most important first (the budget cuts the end; $OUT/all.tgz is rewritten after each part,
# so a cut call still brings back the rest):
#   1. training steps, ours then PyTorch's on the same model: the reference Llama and the
#      large one (12 x 768, batch 16 x 512), f32 (PyTorch eager, TF32 off) and half precision
#      (ours f16 with f32 master weights; PyTorch bf16 autocast with SDPA and fused AdamW, the
#      goal's baseline);
#   2. matmul with each product's GPU time (MLX_PROFILE=1: timestamp queries, free of the
#      host's recording; the wall clock of mid-sized products varied 4x between processes on
#      the H200): f32 and f16 by default (tensor-core products unchecked and double
#      buffered), f16 with one buffer (MLX_GPU_TUNING=coop_double_buffer=off: two barriers a slice,
#      4 staging fragments a round) and on the tall tile (MLX_GPU_TUNING=coop_tile=256x128), f32 on
#      the other large tiles (MLX_GPU_TUNING=f32_tile=...); then
#      cuBLAS (torch_gpu_ops.py) f32 (TF32 off), f16;
#   3. attention forward and backward with the kernels' GPU time, f32 and f16 (and f16 without
#      wgpu's checks, MLX_GPU_TUNING=checked=off), and PyTorch's SDPA (bench/torch_attention.py);
#   4. memory-bound kernels with their GPU time (f32, f16), and PyTorch's, with its device copy;
#   5. where a half-precision step's time goes (MLX_PROFILE=1), reference and large, and the
#      large f32 step's products by shape;
#   6. the host's cost per dispatch (gpu_dispatch_bench), and the split-K wave at 264 and 1056
#      beside the default 528, with GPU times.
# Here: bench/gpu.sh pack; there (carry .gpu-bin and .gl), with timeout_s 560:
#   BUDGET=480 bash bench/gpu_ab.sh
set -u
g=/tmp/gab; mkdir -p $g
end=$((SECONDS + ${BUDGET:-480}))
left() { [ $SECONDS -lt $end ]; }
pack() { tar czf $OUT/all.tgz -C $g . ; }
bench/gpu.sh vulkan > $g/vulkan.log 2>&1; head -n 4 $g/vulkan.log
B=.gpu-bin
# 0. The products' and the fused loss's specs on this card, by default and on the tall tensor-core
#    tiling: lavapipe runs neither the double-buffered 128 x 128 tensor-core tilings nor the tall
#    one (32 KiB), only their plain-fragment template at smaller tilings.
xz -dc $B/tests/mlx-array_gpu_conformance.xz > /tmp/gpu_conformance && chmod +x /tmp/gpu_conformance
for tile in 128x128 256x128; do
  left && env CI=1 MLX_REQUIRE_GPU=1 MLX_GPU_TUNING=coop_tile=$tile timeout 150 /tmp/gpu_conformance \
    --test-threads 1 matmul:: linear_loss:: > $g/conformance_$tile.log 2>&1
  echo "specs, coop tile $tile: $(grep -E '^test result' $g/conformance_$tile.log) \
    $(grep -c FAILED $g/conformance_$tile.log) failed"
done
PY=${PYTHON:-python3}
R=(train --eval-every 0 --data offline --device gpu --global-batch 4 --block-size 512 --fresh)
L=(--layers 12 --dims 768 --heads 12 --mlp-dims 2048 --global-batch 16)
T=(bench/torch_train_llama.py --device cuda --block 512)
ours() { # name, steps, args...: one run of ours, its last step times shown
  local name=$1 steps=$2; shift 2
  left && timeout 200 $B/mlx-llama "${R[@]}" --steps "$steps" "$@" --out /tmp/$name \
    --summary $g/$name.json > $g/$name.log 2>&1
  echo "$name: $(grep -o 'ms_per_step=[0-9.]*' $g/$name.log | tail -n 3 | tr '\n' ' ')"
  rm -rf /tmp/$name
}
torch() { # name, args...: one PyTorch run, its median step shown
  local name=$1; shift
  left && timeout 200 $PY "${T[@]}" --steps 10 --time-from 3 "$@" > $g/$name.log 2>&1
  echo "$name: $(grep -o 'median [0-9.]* s/step' $g/$name.log)"
}
# 1. Training steps, ours and PyTorch's, each model and precision side by side.
ours ref_f32 12 --dtype f32
torch torch_ref_f32
ours ref_f16 20 --dtype f16
torch torch_ref_bf16_sdpa --autocast bf16 --sdpa --fused-adamw
pack
ours large_f32 6 --dtype f32 "${L[@]}"
torch torch_large_f32 "${L[@]}"
ours large_f16 8 --dtype f16 "${L[@]}"
torch torch_large_bf16_sdpa "${L[@]}" --autocast bf16 --sdpa --fused-adamw
pack
# 2. Matrix products: every product's GPU time.
mm() { # name, then VAR=value settings: gpu_bench's matmul table, f32 and f16, with GPU times
  local name=$1; shift
  for d in f32 f16; do
    left && env MLX_PROFILE=1 "$@" timeout 100 $B/gpu_bench --dtype $d --only matmul \
      > $g/mm_${name}_$d.log 2>&1
    echo "$name $d:"; grep -E "^matmul" $g/mm_${name}_$d.log | sed 's/.*(\([0-9x]*\)): /\1 /'
  done
}
mm default
left && env MLX_PROFILE=1 MLX_GPU_TUNING=coop_double_buffer=off timeout 100 $B/gpu_bench --dtype f16 \
  --only matmul > $g/mm_one_buffer_f16.log 2>&1; echo "one buffer f16:"
grep -E "^matmul" $g/mm_one_buffer_f16.log | sed 's/.*(\([0-9x]*\)): /\1 /'
left && env MLX_PROFILE=1 MLX_GPU_TUNING=coop_tile=256x128 timeout 100 $B/gpu_bench --dtype f16 \
  --only matmul > $g/mm_tall_f16.log 2>&1; echo "tall tensor-core tile f16:"
grep -E "^matmul" $g/mm_tall_f16.log | sed 's/.*(\([0-9x]*\)): /\1 /'
# The f32 kernel's other large tiles (MLX_GPU_TUNING=f32_tile=...; 128x128 on 16 x 16 invocations is the
# default above): which reaches 60% of cuBLAS?
for t in 128x64 128x128/128 256x128; do
  f=$g/mm_tile_${t//\//w}_f32.log
  left && env MLX_PROFILE=1 MLX_GPU_TUNING=f32_tile=$t timeout 100 $B/gpu_bench --dtype f32 --only matmul \
    > $f 2>&1; echo "f32 tile $t:"; grep -E "^matmul" $f | sed 's/.*(\([0-9x]*\)): /\1 /'
done
pack
left && timeout 150 $PY bench/torch_gpu_ops.py --only matmul --dtypes f32,f16 > $g/torch_mm.log 2>&1
grep -E "TFLOP" $g/torch_mm.log | head -n 20
pack
# 3. Attention: ours with the kernels' GPU time, PyTorch's SDPA.
for d in f32 f16; do
  left && MLX_PROFILE=1 timeout 100 $B/gpu_bench --dtype $d --only attention > $g/att_$d.log 2>&1
  grep -E "^attention" $g/att_$d.log
done
# The f16 attention kernels keep wgpu's checks by default (not audited): what would dropping them gain?
left && MLX_PROFILE=1 MLX_GPU_TUNING=checked=off timeout 100 $B/gpu_bench --dtype f16 --only attention \
  > $g/att_f16_unchecked.log 2>&1; echo "unchecked:"; grep -E "^attention" $g/att_f16_unchecked.log
left && timeout 100 $PY bench/torch_attention.py > $g/torch_attention.log 2>&1
grep RESULT $g/torch_attention.log
pack
# 4. Memory-bound kernels: ours with GPU times, PyTorch's with its device copy.
for d in f32 f16; do
  left && MLX_PROFILE=1 timeout 100 $B/gpu_bench --dtype $d --only memory > $g/ops_$d.log 2>&1
  grep -E "GB/s" $g/ops_$d.log
  left && timeout 100 $PY bench/torch_gpu_ops.py --only memory --mem-dtype $d > $g/torch_mem_$d.log 2>&1
  grep -E "GB/s" $g/torch_mem_$d.log
done
pack
# 5. Where a half-precision step's time goes.
left && MLX_PROFILE=1 timeout 150 $B/mlx-llama "${R[@]}" --dtype f16 --steps 4 --out /tmp/pf16 \
  > $g/prof_ref_f16.log 2>&1
grep -A14 "GPU execution time" $g/prof_ref_f16.log | head -n 14; rm -rf /tmp/pf16
# The host's side of steps 2 and 3: recording time and kernels a step (lavapipe counted 269 on
# 2026-11-28 at a smaller batch and vocabulary; split-K and the loss's blocks follow the shapes).
grep -E "^step=[23] host" $g/prof_ref_f16.log | grep -oE "(host_ms|gpu_recording_ms|gpu_dispatches|gpu_wait_ms)=[0-9.]+" \
  | tr '\n' ' '; echo
left && MLX_PROFILE=1 timeout 200 $B/mlx-llama "${R[@]}" "${L[@]}" --dtype f16 --steps 3 \
  --out /tmp/plarge > $g/prof_large_f16.log 2>&1
grep -A14 "GPU execution time" $g/prof_large_f16.log | head -n 14; rm -rf /tmp/plarge
# The large f32 step's products by shape: the weight gradients (768 x 8192 x 2048 and
# 768 x 8192 x 768) ran at 20-21 TFLOP/s on 64 x 64 tiles on the H200; now split on 128 x 128.
left && MLX_PROFILE=1 timeout 200 $B/mlx-llama "${R[@]}" "${L[@]}" --dtype f32 --steps 3 \
  --out /tmp/plarge > $g/prof_large_f32.log 2>&1
sed -n '/GPU execution time/,$p' $g/prof_large_f32.log | grep -E "^  (matmul|linear_cross|attention)" \
  | head -n 16; rm -rf /tmp/plarge
# 6. The host's cost per dispatch (recording, and the evaluator's share of a block's), then the
#    split-K wave (workgroups one wave holds; 528 by default) at 264 and 1056.
left && timeout 60 $B/gpu_dispatch_bench > $g/dispatch_bench.log 2>&1; tail -n 3 $g/dispatch_bench.log
for w in 264 1056; do mm wave$w MLX_GPU_TUNING=split_wave=$w; done
pack; echo packed
