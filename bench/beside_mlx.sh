#!/usr/bin/env bash
# Side-by-side rounds of the reference experiment against MLX, as recorded in
# BENCHMARKS.md ("Training throughput beside MLX"): each round runs MLX at
# world 1, ours at world 1, MLX at world 2 (ranks started directly, as
# ../shared/anchors/README.md says), ours at world 2; 5 steps each.
#
#   bench/beside_mlx.sh [rounds]
#
# Needs MLX set up as in ../shared/anchors/README.md and our release build
# (`cargo build --release -p mlx-llama -p mlx-dist --bin mlx-llama --bin mlx-launch`).
# Overridable: MLX_DIR (train_llama.py's folder), MLX_PYTHON, OBLAS (the
# OpenBLAS library MLX is run with), TOKENIZER (ours).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-1}"
MLX_DIR="${MLX_DIR:-$root/../shared/anchors/mlx}"
MLX_PYTHON="${MLX_PYTHON:-$HOME/mlx-venv/bin/python}"
OBLAS="${OBLAS:-/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0}"
TOKENIZER="${TOKENIZER:-gpt2:$root/../shared/data/gpt2}"
# Both sides get OpenBLAS's AVX-512 kernels (ours sets this itself; see BENCHMARKS.md).
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"

for f in "$MLX_DIR/train_llama.py" "$MLX_PYTHON" "$OBLAS" "$root/target/release/mlx-llama" "$root/target/release/mlx-launch"; do
  [ -e "$f" ] || { echo "beside_mlx: $f is missing (see the header of $0)" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo '[["127.0.0.1:42323"],["127.0.0.1:42324"]]' > "$work/hf.json"
ours=(train --steps 5 --tokenizer "$TOKENIZER" --data offline --fresh)

for round in $(seq 1 "$rounds"); do
  echo "== round $round, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
  (cd "$MLX_DIR" && LD_PRELOAD="$OBLAS" "$MLX_PYTHON" train_llama.py --steps 5 --time-from 3 2>&1 \
    | grep RESULT | sed 's/^/MLX w1: /')
  "$root/target/release/mlx-llama" "${ours[@]}" --out "$work/w1" 2>&1 | grep "done:" | sed 's/^/ours w1: /'
  (cd "$MLX_DIR" && for r in 0 1; do
     LD_PRELOAD="$OBLAS" MLX_HOSTFILE="$work/hf.json" MLX_RANK=$r "$MLX_PYTHON" train_llama.py \
       --steps 5 --time-from 3 --backend ring --grad avg > "$work/mlx_w2_$r.log" 2>&1 &
   done; wait)
  grep RESULT "$work/mlx_w2_0.log" | sed 's/^/MLX w2: /'
  "$root/target/release/mlx-launch" -n 2 -- "$root/target/release/mlx-llama" "${ours[@]}" --out "$work/w2" 2>&1 \
    | grep "done:" | sed 's/^/ours w2: /'
done
