#!/usr/bin/env bash
# A model whose replicated training does not fit a rank's memory, trained
# with ZeRO-3 and activation checkpointing at world 4. Linux only (cgroup
# v1 or v2 memory controller, as root): each rank runs in a cgroup of its
# own whose memory limit the kernel enforces (the OOM killer ends a rank
# that goes over it).
#
# The model: 12 layers, 768 dims, 12 heads, MLP 2048, GPT-2's vocabulary
# (162M parameters: 650 MB of float32 weights, 2.6 GB with their gradients
# and AdamW's moments). Per rank: 1 sequence of 256 tokens, STEPS steps.
#
#   bench/zero3_budget.sh [limit-bytes] [steps]   # default 1.5 GiB, 2 steps
#
# Runs `--shard none` (replicated: killed by the limit) and then
# `--shard parameters --grad-checkpoint --memory-budget LIMIT` (trains: the
# budget also caps the buffer cache at what it leaves over the estimate),
# printing each rank's
# peak usage as the kernel counted it (memory.max_usage_in_bytes / memory.peak)
# and the trainer's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${1:-1610612736}"
steps="${2:-2}"
bin="$(realpath "${MLX_LLAMA:-target/release/mlx-llama}")"
launch="$(realpath "${MLX_LAUNCH:-target/release/mlx-launch}")"
[ "$(id -u)" = 0 ] || { echo "zero3_budget: needs root (cgroups)" >&2; exit 1; }
if [ -d /sys/fs/cgroup/memory ]; then
  base=/sys/fs/cgroup/memory; limit_file=memory.limit_in_bytes; peak_file=memory.max_usage_in_bytes
else
  base=/sys/fs/cgroup; limit_file=memory.max; peak_file=memory.peak
fi
work="$(mktemp -d)"
cleanup() {
  for d in "$base"/mlx-zero3-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# Each rank moves itself into its cgroup, then becomes the trainer.
cat > "$work/in_cgroup.sh" <<INNER
#!/usr/bin/env bash
set -e
g="$base/mlx-zero3-\$1-\$MLX_RANK"
mkdir -p "\$g"
echo "$limit" > "\$g/$limit_file"
echo 0 > "\$g/memory.swappiness" 2>/dev/null || true
echo \$\$ > "\$g/cgroup.procs"
shift
exec "\$@"
INNER
chmod +x "$work/in_cgroup.sh"
"$bin" train --data offline --steps 1 --eval-every 0 --report-to none --out "$work/prep" \
  --data-cache "$work/cache" > /dev/null 2>&1
echo "# $(date -u +%FT%TZ) bench/zero3_budget.sh $limit $steps ($(nproc) CPUs): limit $((limit >> 20)) MiB per rank"
for run in "none none 100GiB" "parameters all $limit"; do
  set -- $run
  shard=$1 gc=$2 budget=$3
  echo "## --shard $shard --grad-checkpoint $gc"
  set +e
  RAYON_NUM_THREADS=1 "$launch" -n 4 -- "$work/in_cgroup.sh" "$shard" "$bin" train --data offline \
    --layers 12 --dims 768 --heads 12 --mlp-dims 2048 --per-rank-batch 1 --block-size 256 \
    --steps "$steps" --eval-every 0 --checkpoint-every 0 --checkpoint-interval-s 0 --report-to none \
    --shard "$shard" --grad-checkpoint "$gc" --memory-budget "$budget" \
    --out "$work/$shard" --data-cache "$work/cache" > "$work/$shard.log" 2>&1
  code=$?
  set -e
  grep -E "memory estimate|^\[0\]   (parameters|gradients|optimizer|activations|total)|step=|done:|error|Killed|signal" "$work/$shard.log" | head -20
  echo "exit status $code"
  for r in 0 1 2 3; do
    g="$base/mlx-zero3-$shard-$r"
    [ -f "$g/$peak_file" ] && echo "rank $r: peak $(( $(cat "$g/$peak_file") >> 20 )) MiB (cgroup)"
  done
done
