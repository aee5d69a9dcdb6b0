#!/usr/bin/env bash
# One device call that runs every phase of bench/gpu.sh for issue 38 (the GPU suites, gpu_bench in three dtypes and without cooperative matrices, training at both sizes, the profile, PyTorch eager f32 at both sizes), logs tarred into $OUT/all.tgz after each phase; BUDGET seconds (520) bounds it. Run as: BUDGET=480 bash bench/gpu_session.sh
set -u
g=/tmp/g; mkdir -p $g/conf $g/ops $g/ref $g/large $g/prof
export STEPS=10 RUN_TIMEOUT=100
end=$((SECONDS + ${BUDGET:-520}))
left() { [ $SECONDS -lt $end ]; }
pack() { tar czf $OUT/all.tgz -C $g . ; }
bench/gpu.sh conformance $g/conf
pack
for d in f32 f16 bf16; do
  left && timeout 100 .gpu-bin/gpu_bench --dtype $d > $g/ops/ops_ours_$d.log 2>&1
  grep -E "matmul|attention|GB/s" $g/ops/ops_ours_$d.log | grep -v RESULT | head -30
done
left && MLX_GPU_TUNING=coopmat=off timeout 100 .gpu-bin/gpu_bench --dtype f16 > $g/ops/ops_nocoop_f16.log 2>&1
grep -E "matmul float16 (4096|8192)" $g/ops/ops_nocoop_f16.log
pack
left && RUN_TIMEOUT=60 SYSTEMS=ours bench/gpu.sh train large $g/large
pack
left && SYSTEMS=ours bench/gpu.sh train ref $g/ref
pack
left && bench/gpu.sh profile $g/prof
pack
if left; then
  python3 bench/torch_train_llama.py --device cuda --steps 10 --time-from 3 --global-batch 4 --block 512 > $g/ref/train_ref_torch_eager_f32_w1.log 2>&1
  tail -n 2 $g/ref/train_ref_torch_eager_f32_w1.log
fi
if left; then
  python3 bench/torch_train_llama.py --device cuda --steps 10 --time-from 3 --global-batch 16 --block 512 --layers 12 --dims 768 --heads 12 --mlp-dims 2048 > $g/large/train_large_torch_eager_f32_w1.log 2>&1
  tail -n 2 $g/large/train_large_torch_eager_f32_w1.log
fi
pack; echo packed
