#!/usr/bin/env bash
# Grouped-query attention against the same model with full heads, on the CPU:
# one training step's median time and peak array memory, world 1, offline
# data, global batch 4 x 512 tokens, AdamW 3e-4, f32, each pair of runs back
# to back, ROUNDS times (the machine is shared: compare the pairs, not the
# absolute times). Two shapes:
#
#   reference   4 layers, 256 dims, 4 heads of 64   vs --kv-heads 1 (multi-query)
#   wide        4 layers, 1024 dims, 16 heads of 64 vs --kv-heads 4 (Llama 3's 4:1)
#
# Each run's --summary JSON gives step_ms (the median is over steps 3..N) and
# peak_mib (the array allocator's peak). Ends with one Markdown table.
#
#   bench/gqa.sh [steps] [rounds]        # default 8 steps, 2 rounds
#   MLX_LLAMA=path/to/mlx-llama bench/gqa.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-8}"
rounds="${2:-2}"
bin="${MLX_LLAMA:-target/release/mlx-llama}"
[ -x "$bin" ] || { echo "gqa: build it first: cargo build --release -p mlx-llama" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(train --steps "$steps" --global-batch 4 --block-size 512 --data offline
        --eval-every 0 --checkpoint-interval-s 0 --report-to none --layers 4)
shapes=("reference:--dims 256 --heads 4 --mlp-dims 512:1"
        "wide:--dims 1024 --heads 16 --mlp-dims 2048:4")
rows="$work/rows"
for round in $(seq 1 "$rounds"); do
  for shape in "${shapes[@]}"; do
    IFS=: read -r name opts kv <<< "$shape"
    heads=$(sed -E 's/.*--heads ([0-9]+).*/\1/' <<< "$opts")
    for k in "$heads" "$kv"; do
      out="$work/$name-$k-$round"
      # shellcheck disable=SC2086
      "$bin" "${common[@]}" $opts --kv-heads "$k" --out "$out" --summary "$out.json" \
        > "$out.log" 2>&1 || { tail -5 "$out.log"; exit 1; }
      python3 - "$out.json" "$name" "$heads" "$k" >> "$rows" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1]))
ms = s["step_ms"][2:] or s["step_ms"]
print(sys.argv[2], sys.argv[3], sys.argv[4], f"{statistics.median(ms):.0f}", f"{s['peak_mib']:.1f}")
PY
      tail -1 "$rows"
    done
  done
done
echo
echo "| model | heads | key/value heads | median ms/step (each round) | peak MiB |"
echo "|---|---|---|---|---|"
python3 - "$rows" <<'PY'
import collections, sys
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    name, h, kv, ms, peak = line.split()
    runs.setdefault((name, h, kv), []).append((ms, peak))
for (name, h, kv), r in runs.items():
    print(f"| {name} | {h} | {kv} | {' / '.join(m for m, _ in r)} | {r[0][1]} |")
PY
