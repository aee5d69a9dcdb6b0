#!/usr/bin/env bash
# Model-parallel generation (issue 24): greedy tokens/s of
# `mlx-llama generate --temperature 0` from one checkpoint in one process,
# and split over 2 and 4 ranks with --parallel tensor and --parallel pipeline,
# on loopback (`mlx-launch -n N`) and, with HOSTS=1, across emulated hosts
# (`cargo xtask hosts up 4 --rate $RATE`: network namespaces with sshd and
# tc-shaped links, one rank per host), one run after another in one
# invocation, ROUNDS rounds interleaved (the table gives each configuration's
# median). Every run's text is checked against the one-process text.
#
#   bench/generate.sh                       # the reference model, loopback
#   HOSTS=1 RATE=1gbit bench/generate.sh    # and across 4 emulated hosts
#   MODEL=wide bench/generate.sh            # 8 blocks of 1024 dims, MLP 4096
#
# MODEL=reference: 4 blocks of 256 dims, 4 heads, MLP 512, vocabulary 50,257
# (the trained experiment; its embedding and output projection, 2 x 49 MiB,
# stay whole on every rank, the blocks' linear weights are 10 MiB).
# MODEL=wide: 8 blocks of 1024 dims, 16 heads, MLP 4096 (the blocks' linear
# weights are 512 MiB, what tensor parallelism divides). Each model is
# trained for a few steps on the offline corpus into $OUT/$MODEL (kept, and
# reused by later invocations) so the checkpoint is a real one.
#
# Threads: every rank gets cores / ranks of this machine's cores
# (RAYON_NUM_THREADS, OPENBLAS_NUM_THREADS), one process gets them all.
# Each rank reports the bytes of the parameters it holds and its peak array
# memory while loading (each rank reads only its part of the checkpoint) and
# while generating (mlx-llama's stderr); the table shows rank 0's holding and
# the largest of every figure.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-reference}
TOKENS=${TOKENS:-200}
ROUNDS=${ROUNDS:-3}
HOSTS=${HOSTS:-0}
RATE=${RATE:-1gbit}
OUT=${OUT:-target/bench-generate}
mkdir -p "$OUT"
cargo build --release -q -p mlx-llama --bin mlx-llama -p mlx-dist --bin mlx-launch
BIN=target/release
CORES=$(nproc)

case $MODEL in
reference) SHAPE=(--steps 60) ;;
wide) SHAPE=(--steps 3 --layers 8 --dims 1024 --heads 16 --mlp-dims 4096 --block-size 64 --global-batch 2) ;;
*) echo "MODEL is reference or wide" >&2; exit 2 ;;
esac
CKPT=$OUT/$MODEL
if [ ! -e "$CKPT/checkpoints/latest" ]; then
    rm -rf "$CKPT"
    echo "training the $MODEL model into $CKPT" >&2
    "$BIN/mlx-llama" train "${SHAPE[@]}" --data offline --lr 1e-3 --out "$CKPT" >"$OUT/$MODEL-train.log" 2>&1
fi

GEN=(generate --checkpoint "$CKPT" --temperature 0 --max-tokens "$TOKENS" --prompt "Once upon a time")
LOGS=$OUT/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"

cleanup() { if [ "$HOSTS" = 1 ]; then cargo xtask hosts down >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
if [ "$HOSTS" = 1 ]; then
    cargo xtask hosts up 4 --rate "$RATE" >&2
fi

# run NAME WORLD MODE PLACE: one generation; its stdout and stderr in $LOGS/NAME.
run() {
    local name=$1 world=$2 mode=$3 place=$4 threads=$((CORES / $2))
    [ "$threads" -ge 1 ] || threads=1
    if [ "$world" = 1 ]; then
        RAYON_NUM_THREADS=$CORES OPENBLAS_NUM_THREADS=$CORES \
            "$BIN/mlx-llama" "${GEN[@]}" >"$LOGS/$name.out" 2>"$LOGS/$name.err"
        return
    fi
    local where=(-n "$world")
    if [ "$place" = hosts ]; then
        local names
        names=$(for i in $(seq 0 $((world - 1))); do printf 'mlxh%d,' "$i"; done)
        where=(--ssh-config target/mlx-hosts/ssh_config --hosts "${names%,}" -n 1)
    fi
    "$BIN/mlx-launch" "${where[@]}" --env RAYON_NUM_THREADS=$threads --env OPENBLAS_NUM_THREADS=$threads \
        -- "$PWD/$BIN/mlx-llama" "${GEN[@]}" --parallel "$mode" >"$LOGS/$name.out" 2>"$LOGS/$name.err"
}

CONFIGS=("1 none loopback")
for w in 2 4; do
    for m in tensor pipeline; do
        CONFIGS+=("$w $m loopback")
        if [ "$HOSTS" = 1 ]; then CONFIGS+=("$w $m hosts"); fi
    done
done
for round in $(seq 1 "$ROUNDS"); do
    for c in "${CONFIGS[@]}"; do
        read -r w m p <<<"$c"
        name="w$w-$m-$p-r$round"
        echo "round $round: world $w, $m, $p" >&2
        run "$name" "$w" "$m" "$p" || { echo "failed: $name (see $LOGS/$name.err)" >&2; exit 1; }
    done
done

python3 - "$LOGS" "$MODEL" "$TOKENS" "$HOSTS" "$RATE" "${CONFIGS[@]}" <<'EOF'
import re, statistics, sys, pathlib
logs, model, tokens, hosts, rate, *configs = sys.argv[1:]
logs = pathlib.Path(logs)
def text(path):
    return "".join(l[4:] if l.startswith("[0] ") else l for l in path.read_text().splitlines(True))
want = text(logs / "w1-none-loopback-r1.out")
print(f"| mode | world | where | tokens/s (median) | vs one process | parameters held, rank 0 / largest (MiB) | peak arrays loading / generating, largest rank (MiB) |")
print("|---|---|---|---|---|---|---|")
base = None
for c in configs:
    w, m, p = c.split()
    runs = sorted(logs.glob(f"w{w}-{m}-{p}-r*.err"))
    rates, held, loads, peaks = [], [], [], []
    for err in runs:
        out = err.with_suffix(".out")
        if text(out) != want:
            sys.exit(f"{out}: the text differs from one process's")
        e = err.read_text()
        rates.append(float(re.search(r"([\d.]+) tokens/s", e).group(1)))
        mem = re.findall(r"rank (\d+): holds ([\d.]+) MiB of parameters, peak ([\d.]+) MiB of arrays while loading, ([\d.]+) MiB while generating", e)
        held = [(int(r), float(h)) for r, h, _, _ in mem]
        loads.append(max(float(x) for _, _, x, _ in mem))
        peaks.append(max(float(x) for _, _, _, x in mem))
    tps = statistics.median(rates)
    if base is None:
        base = tps
    h0 = dict(held)[0]
    hmax = max(h for _, h in held)
    where = "loopback" if p == "loopback" else f"{w} emulated hosts, {rate}"
    mode = "one process" if m == "none" else m
    print(f"| {mode} | {w} | {where} | {tps:.1f} | {tps / base:.2f}x | {h0:.1f} / {hmax:.1f} | {max(loads):.1f} / {max(peaks):.1f} |")
print(f"\nmodel {model}, {tokens} greedy tokens, every run's text equal to one process's")
EOF
