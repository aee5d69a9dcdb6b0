#!/usr/bin/env bash
# LoRA fine-tuning against full fine-tuning, and against mlx-lm and PEFT, on
# the CPU: one model, one dataset, global batch 4 x 256 tokens, AdamW 3e-4,
# f32, rank 8 / alpha 16 on all seven projections (q,k,v,o,gate,up,down) of
# every block, STEPS steps with the first 3 left out of the medians. Each
# round runs, back to back:
#
#   ours-lora, ours-full      world 1: step time, peak array MiB, max RSS
#   ours-lora-w2, ours-full-w2  mlx-launch -n 2: bytes rank 0 sends per step
#   mlx-lm                    mlx_lm.lora (OpenBLAS preloaded, the anchors' fair setting)
#   peft                      bench/lora_peft.py: PEFT LoRA + AdamW, plain loop
#
# The model: 4 layers, 256 dims, 4 heads, MLP 512, GPT-2's vocabulary (the
# reference shape) with random weights, trained 2 steps by us and exported
# with `mlx-llama export --format hf` (the same folder for all three). The
# data: rows of 3,000 characters of manual pages (bench/man_corpus.py) as
# JSON Lines {"text"}, longer than 256 tokens, so every batch is full (mlx-lm
# and PEFT cut each row at 256 tokens; we pack rows into 256-token blocks).
#
# Bytes per step come from mlx_dist::stats (the summary's sent_bytes, what
# the ring algorithms send from the rank; payload_bytes, what it hands to the
# collectives), the median over steps 4..N of rank 0. Max RSS is
# /usr/bin/time's for every tool alike; mlx-lm's step time is its reported
# tokens/s per step (steps-per-report 1) turned into s = 4 x 255 tokens / tok/s.
#
#   bench/lora.sh [steps] [rounds]        # default 12 steps, 2 rounds
#   MLX_LLAMA=... MLX_LAUNCH=... MLX_PY=... TORCH_PY=... bench/lora.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-12}"
rounds="${2:-2}"
bin="$(realpath "${MLX_LLAMA:-target/debug/mlx-llama}")"
launch="$(realpath "${MLX_LAUNCH:-target/debug/mlx-launch}")"
mlx_py="${MLX_PY:-$HOME/mlx-venv/bin/python}"
torch_py="${TORCH_PY:-$HOME/torch-venv/bin/python}"
peft="$(realpath bench/lora_peft.py)"
for x in "$bin" "$launch"; do
  [ -x "$x" ] || { echo "lora: build first: cargo build -p mlx-llama --bin mlx-llama && cargo build -p mlx-dist --bin mlx-launch" >&2; exit 1; }
done
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"
oblas="${OBLAS:-$(dpkg -L libopenblas0-pthread 2>/dev/null | grep 'openblas-pthread/libopenblas.so.0$' || true)}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

# The model and the data, once.
python3 "$OLDPWD/bench/man_corpus.py" corpus > /dev/null
mkdir data
python3 - <<'PY'
import json
t = open("corpus/train.txt").read()
rows = [t[i:i + 3000] for i in range(0, 3000 * 420, 3000)]
for name, part in (("train", rows[:400]), ("valid", rows[400:])):
    with open(f"data/{name}.jsonl", "w") as f:
        f.writelines(json.dumps({"text": r}) + "\n" for r in part)
PY
"$bin" train --steps 2 --layers 4 --dims 256 --heads 4 --mlp-dims 512 \
  --tokenizer gpt2:/work/shared/data/gpt2 --data offline --global-batch 4 --block-size 256 \
  --eval-every 0 --checkpoint-interval-s 0 --report-to none --out base-run > base.log 2>&1
"$bin" export --checkpoint base-run --out base-hf --format hf >> base.log 2>&1
cat > lora.yaml <<'EOF'
lora_parameters:
  rank: 8
  scale: 2.0
  dropout: 0.0
  keys: ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
EOF

ours=(train --init-from base-hf --data jsonl:data/train.jsonl,data/valid.jsonl
      --steps "$steps" --global-batch 4 --block-size 256 --lr 3e-4
      --eval-every 0 --checkpoint-interval-s 0 --report-to none --fresh)
lora=(--fine-tune lora --lora-rank 8 --lora-alpha 16 --lora-layers 0
      --lora-targets q,k,v,o,gate,up,down)
rss() { sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$1" | awk '{ printf "%.0f", $1 / 1024 }'; }
summ() {  # summary.json -> "ms/step peak_mib sent_bytes/step payload_bytes/step"
  python3 - "$1" <<'PY'
import json, statistics, sys
s = json.load(open(sys.argv[1]))
med = lambda v: statistics.median(v[3:] or v)
print(f"{med(s['step_ms']):.0f} {s['peak_mib']:.0f} {med(s['sent_bytes']):.0f} {med(s['payload_bytes']):.0f}")
PY
}
rows="$work/rows"
for round in $(seq 1 "$rounds"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  for mode in lora full; do
    opts=("${lora[@]}"); [ "$mode" = full ] && opts=(--fine-tune full)
    /usr/bin/time -v "$bin" "${ours[@]}" "${opts[@]}" --out "o1-$mode" --summary "o1-$mode.json" \
      > "o1-$mode.log" 2>&1 || { tail -5 "o1-$mode.log"; exit 1; }
    read -r ms peak _ _ < <(summ "o1-$mode.json")
    echo "ours-$mode $round $ms $peak $(rss "o1-$mode.log") - -" >> "$rows"; tail -1 "$rows"
    "$launch" -n 2 -- "$bin" "${ours[@]}" "${opts[@]}" --out "o2-$mode" --summary "o2-$mode.json" \
      > "o2-$mode.log" 2>&1 || { tail -5 "o2-$mode.log"; exit 1; }
    read -r ms peak sent payload < <(summ "o2-$mode.json")
    echo "ours-$mode-w2 $round $ms $peak - $sent $payload" >> "$rows"; tail -1 "$rows"
  done
  rm -rf ad
  LD_PRELOAD="$oblas" /usr/bin/time -v "$(dirname "$mlx_py")/mlx_lm.lora" --model base-hf --train --data data \
    --fine-tune-type lora --num-layers 4 --batch-size 4 --iters "$steps" --max-seq-length 256 \
    --learning-rate 3e-4 --steps-per-report 1 --steps-per-eval 100000 --val-batches 1 \
    --adapter-path ad -c lora.yaml > mlx.log 2>&1 || { tail -5 mlx.log; exit 1; }
  # Its progress lines: "iteration loss arrow tokens/s trained-tokens" (ANSI colours stripped).
  ms=$(sed 's/\x1b\[[0-9;]*m//g' mlx.log | awk -v s="$steps" '$3 ~ /[▼▲=]/ && $1 > 3 && $1 <= s { print 4 * 255 / $4 * 1000 }' \
       | sort -g | awk '{ v[NR] = $1 } END { printf "%.0f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "mlx-lm $round $ms - $(rss mlx.log) - -" >> "$rows"; tail -1 "$rows"
  /usr/bin/time -v "$torch_py" "$peft" --model base-hf --data data/train.jsonl --rank 8 --alpha 16 \
    --layers 4 --targets q,k,v,o,gate,up,down --batch 4 --seq 256 --steps "$steps" --time-from 4 \
    > peft.log 2>&1 || { tail -5 peft.log; exit 1; }
  ms=$(sed -n 's/^RESULT .*"median_step_s": \([0-9.e-]*\).*/\1/p' peft.log | awk '{ printf "%.0f", $1 * 1000 }')
  echo "peft $round $ms - $(rss peft.log) - -" >> "$rows"; tail -1 "$rows"
  echo "round $round: load $load"
done
echo
echo "| run | median ms/step (each round) | peak array MiB | max RSS MiB | sent bytes/step/rank | payload bytes/step/rank |"
echo "|---|---|---|---|---|---|"
python3 - "$rows" <<'PY'
import collections, sys
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    name, rnd, ms, peak, rss, sent, payload = line.split()
    runs.setdefault(name, []).append((ms, peak, rss, sent, payload))
for name, r in runs.items():
    col = lambda i: " / ".join(x[i] for x in r)
    print(f"| {name} | {col(0)} | {r[0][1]} | {col(2)} | {r[0][3]} | {r[0][4]} |")
PY
