#!/usr/bin/env bash
# Side-by-side rounds of the reference experiment against MLX, as recorded in
# BENCHMARKS.md ("Training throughput beside MLX"): each round runs MLX at
# world 1, ours at world 1, MLX at world 2 (ranks started directly, as
# ../shared/anchors/README.md says), ours at world 2; 5 steps each. At the
# end it prints a Markdown table: each round's seconds per step and ratios,
# then each side's median over the rounds and the ratio of the medians.
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
ours=(train --steps 5 --eval-every 0 --tokenizer "$TOKENIZER" --data offline --fresh)

# Each run's step time goes to $work/times (round, who, seconds per step) for
# the summary at the end.
mlx_time() { sed -n 's/^RESULT {[^{}]*"median_step_s": \([0-9.e-]*\).*/\1/p'; }
our_time() { sed -n 's/.*median \([0-9]*\) ms\/step.*/\1/p' | awk '{ print $1 / 1000 }'; }
times="$work/times"
for round in $(seq 1 "$rounds"); do
  echo "== round $round, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
  (cd "$MLX_DIR" && LD_PRELOAD="$OBLAS" "$MLX_PYTHON" train_llama.py --steps 5 --time-from 3 2>&1) \
    | grep RESULT > "$work/mlx_w1.log" || true
  sed 's/^/MLX w1: /' "$work/mlx_w1.log"
  echo "$round mlx_w1 $(mlx_time < "$work/mlx_w1.log")" >> "$times"
  "$root/target/release/mlx-llama" "${ours[@]}" --out "$work/w1" 2>&1 | grep "done:" > "$work/ours_w1.log" || true
  sed 's/^/ours w1: /' "$work/ours_w1.log"
  echo "$round ours_w1 $(our_time < "$work/ours_w1.log")" >> "$times"
  (cd "$MLX_DIR" && for r in 0 1; do
     LD_PRELOAD="$OBLAS" MLX_HOSTFILE="$work/hf.json" MLX_RANK=$r "$MLX_PYTHON" train_llama.py \
       --steps 5 --time-from 3 --backend ring --grad avg > "$work/mlx_w2_$r.log" 2>&1 &
   done; wait)
  grep RESULT "$work/mlx_w2_0.log" | sed 's/^/MLX w2: /'
  echo "$round mlx_w2 $(grep RESULT "$work/mlx_w2_0.log" | mlx_time)" >> "$times"
  "$root/target/release/mlx-launch" -n 2 -- "$root/target/release/mlx-llama" "${ours[@]}" --out "$work/w2" 2>&1 \
    | grep "done:" > "$work/ours_w2.log" || true
  sed 's/^/ours w2: /' "$work/ours_w2.log"
  echo "$round ours_w2 $(our_time < "$work/ours_w2.log")" >> "$times"
done

# Per round: each side's seconds per step and our speed-up; then each
# side's median over the rounds and the ratio of the medians.
awk '
  { t[$1, $2] = $3; if ($1 > n) n = $1 }
  function median(who,   i, k, v, tmp) {
    k = 0
    for (i = 1; i <= n; i++) if ((i, who) in t && t[i, who] != "") v[++k] = t[i, who] + 0
    for (i = 2; i <= k; i++) { tmp = v[i]; for (j = i - 1; j >= 1 && v[j] > tmp; j--) v[j + 1] = v[j]; v[j + 1] = tmp }
    if (k == 0) return 0
    return (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
  }
  function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2fx", a / b) : "-" }
  END {
    print ""
    print "| round | MLX w1 | ours w1 | ratio | MLX w2 | ours w2 | ratio |"
    print "|---|---|---|---|---|---|---|"
    for (i = 1; i <= n; i++)
      printf "| %d | %.2f s | %.2f s | %s | %.2f s | %.2f s | %s |\n", i,
        t[i, "mlx_w1"], t[i, "ours_w1"], ratio(t[i, "mlx_w1"], t[i, "ours_w1"]),
        t[i, "mlx_w2"], t[i, "ours_w2"], ratio(t[i, "mlx_w2"], t[i, "ours_w2"])
    m1 = median("mlx_w1"); o1 = median("ours_w1"); m2 = median("mlx_w2"); o2 = median("ours_w2")
    printf "| median | %.2f s | %.2f s | %s | %.2f s | %.2f s | %s |\n", m1, o1, ratio(m1, o1), m2, o2, ratio(m2, o2)
  }' "$times"
