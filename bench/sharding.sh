#!/usr/bin/env bash
# ZeRO stages and activation checkpointing beside PyTorch, on the CPU, in
# one run: the reference Llama (4 layers, 256 dims, 4 heads, MLP 512, GPT-2's
# vocabulary), 2 sequences of 512 tokens per rank, AdamW 3e-4, f32, STEPS
# steps (median of all but the first), at worlds 2 and 4 (1 thread a rank:
# 4 ranks share the machine's 2 cores, as PyTorch's do).
#
#   ours   mlx-launch -n W mlx-llama train --shard optimizer|gradients|parameters
#          [--grad-checkpoint]: median ms/step, peak array MiB per rank (the
#          summary), peak RSS per rank (/usr/bin/time of each rank)
#   torch  bench/fsdp_torch.py: DDP + ZeroRedundancyOptimizer (zero1), FSDP2
#          fully_shard with reshard_after_forward False (zero2) and True
#          (zero3), torch.utils.checkpoint per decoder layer; gloo
#
#   bench/sharding.sh [steps]                 # default 5
#   MLX_LLAMA=... MLX_LAUNCH=... TORCH_PY=... bench/sharding.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-5}"
bin="$(realpath "${MLX_LLAMA:-target/release/mlx-llama}")"
launch="$(realpath "${MLX_LAUNCH:-target/release/mlx-launch}")"
torch_py="${TORCH_PY:-$HOME/torch-venv/bin/python}"
for x in "$bin" "$launch"; do
  [ -x "$x" ] || { echo "sharding: build first: cargo build --release -p mlx-llama --bin mlx-llama -p mlx-dist --bin mlx-launch" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "# $(date -u +%FT%TZ) bench/sharding.sh $steps ($(nproc) CPUs)"
printf '%-6s %-11s %-5s %-4s %10s %12s %12s\n' who mode world gc ms/step "arrays MiB" "RSS MiB"
# One data preparation before the timed runs.
"$bin" train --data offline --steps 1 --eval-every 0 --report-to none --out "$work/prep" \
  --data-cache "$work/cache" > /dev/null 2>&1
for world in 2 4; do
  for mode in optimizer gradients parameters; do
    for gc in none all; do
      out="$work/ours-$mode-$world-$gc"
      log="$out.log"
      RAYON_NUM_THREADS=1 "$launch" -n "$world" -- \
        /usr/bin/time -f "maxrss_kib=%M" "$bin" train --data offline --steps "$steps" \
        --per-rank-batch 2 --eval-every 0 --checkpoint-every 0 --checkpoint-interval-s 0 \
        --report-to none --shard "$mode" --grad-checkpoint "$gc" --out "$out" \
        --data-cache "$work/cache" > "$log" 2>&1 || { echo "ours $mode $world $gc failed:"; tail -5 "$log"; continue; }
      ms=$(grep -o 'median [0-9.]* ms/step' "$log" | head -1 | awk '{print $2}')
      arrays=$(grep -o 'peak [0-9.]* MiB per rank' "$log" | head -1 | awk '{print $2}')
      rss=$(grep -o 'maxrss_kib=[0-9]*' "$log" | cut -d= -f2 | sort -n | tail -1)
      printf '%-6s %-11s %-5s %-4s %10s %12s %12.1f\n' ours "$mode" "$world" "$gc" "$ms" "$arrays" "$(echo "$rss / 1024" | bc -l)"
    done
  done
done
"$torch_py" bench/fsdp_torch.py --modes zero1,zero2,zero3 --worlds 2,4 --grad-checkpoint both \
  --steps "$steps" --warmup 1 2>&1 >/dev/null | sed 's/^/torch  /'
