#!/usr/bin/env bash
# bfloat16 mixed-precision training of the reference Llama (4 layers, 256 dims,
# 4 heads, MLP 512, vocabulary 50,257; global batch 4 x 512 tokens; AdamW 3e-4)
# beside float32, side by side with PyTorch's CPU autocast and MLX's bf16, one
# run after another in one invocation, at world 1 and world 2:
#
#   ours     target/release/mlx-llama train --dtype f32|bf16 (bf16: f32 master
#            weights and AdamW state); world 2 under `mlx-launch -n 2` with the
#            same global batch of 4 (2 sequences per rank)
#   PyTorch  bench/torch_train_llama.py --autocast off|bf16 (bf16: forward and
#            loss under torch.autocast("cpu", bfloat16), f32 master weights and
#            AdamW state, no GradScaler); world 1 with 2 threads, world 2 DDP
#            over gloo under torchrun, 1 thread per rank
#   MLX      bench/mlx_train_llama.py --dtype float32|bfloat16 (bf16:
#            model.set_dtype(bfloat16), so weights, gradients and AdamW state
#            are bf16 -- MLX has no f32 master-weight mode -- loss in f32),
#            OpenBLAS preloaded; world 2: two ranks started directly on the
#            ring backend (MLX_HOSTFILE/MLX_RANK, as ../shared/anchors/README.md says)
#
# and ends with one Markdown table: system, dtype, world, median s/step,
# tokens/s, peak MiB per rank, each parsed from the program's own summary
# (ours: the `done:` line and its --summary JSON; PyTorch and MLX: their
# `RESULT {json}` line).
#
#   bench/precision.sh [steps]            # default 8 steps per run
#   SYSTEMS="torch mlx" WORLDS=1 DTYPES=bf16 bench/precision.sh 3   # a subset
#
# Time: MLX's bf16 step is about 9x its f32 step on this CPU (its bf16 matmul
# does not go through OpenBLAS: ~67 s a step at world 1, ~40 s at world 2 in
# the short runs of 2026-11-24), so the default 8 steps take ~15 minutes for
# MLX bf16 alone and ~20 for the whole script; DTYPES/SYSTEMS/WORLDS pick a
# subset.
#
# The median is over steps TIME_FROM..steps (default 3..8) for all three:
# PyTorch and MLX take --time-from; ours' `done:` line takes steps 2..N, so
# the script recomputes ours' median from the per-step times of --summary
# (rank 0's), the same statistics.median the Python scripts use. At world 2
# PyTorch and MLX report the slowest rank's median. Tokens/s = 4 x 512 /
# median for all. "peak MiB/rank" is each program's own peak: array memory
# for ours and MLX (their allocators' peaks), resident set (ru_maxrss) for
# PyTorch, which reports nothing else; "RSS MiB/rank" is the resident peak for
# all (ours through /usr/bin/time, the largest of the ranks). Ours trains on
# the offline corpus, PyTorch and MLX on random tokens (the arithmetic is the
# same; the losses compare f32 with bf16 within one system, not across).
#
# Overridable: SYSTEMS ("ours torch mlx"), WORLDS ("1 2"), DTYPES ("f32 bf16"),
# TIME_FROM (3), TORCH_PYTHON (~/torch-venv/bin/python), TORCHRUN (torchrun
# beside it), TORCH_ARGS (extra flags for PyTorch, e.g. --fused-adamw),
# MLX_PYTHON (~/mlx-venv/bin/python), OBLAS (the OpenBLAS MLX runs with),
# MLX_PORT (42323: MLX's ring uses it and the next), MLX_DATA_CACHE
# (/tmp/demo-cache), RUN_TIMEOUT (seconds per run, 1800), KEEP_LOGS=1 (keep
# the logs folder). Needs our release build (`cargo build --release -p
# mlx-llama -p mlx-dist --bin mlx-llama --bin mlx-launch`) and both virtual
# environments of ../shared/anchors/README.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
steps="${1:-${STEPS:-8}}"
TIME_FROM="${TIME_FROM:-3}"
time_from=$(( TIME_FROM < steps ? TIME_FROM : steps ))
SYSTEMS="${SYSTEMS:-ours torch mlx}"
WORLDS="${WORLDS:-1 2}"
DTYPES="${DTYPES:-f32 bf16}"
TORCH_PYTHON="${TORCH_PYTHON:-$HOME/torch-venv/bin/python}"
TORCHRUN="${TORCHRUN:-$(dirname "$TORCH_PYTHON")/torchrun}"
TORCH_ARGS="${TORCH_ARGS:-}"
MLX_PYTHON="${MLX_PYTHON:-$HOME/mlx-venv/bin/python}"
OBLAS="${OBLAS:-$(dpkg -L libopenblas0-pthread 2>/dev/null | grep 'openblas-pthread/libopenblas.so.0$' || echo /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0)}"
MLX_PORT="${MLX_PORT:-42323}"
RUN_TIMEOUT="${RUN_TIMEOUT:-1800}"
export MLX_DATA_CACHE="${MLX_DATA_CACHE:-/tmp/demo-cache}"
# OpenBLAS's AVX-512 kernels for MLX (ours sets this itself; see BENCHMARKS.md).
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}"
PARSE_PYTHON="${PARSE_PYTHON:-$(command -v python3 || echo "$TORCH_PYTHON")}"
ours_bin="$root/target/release/mlx-llama"
launch_bin="$root/target/release/mlx-launch"
torch_py="$root/bench/torch_train_llama.py"
mlx_py="$root/bench/mlx_train_llama.py"

need=("$PARSE_PYTHON")
for s in $SYSTEMS; do
  case $s in
    ours) need+=("$ours_bin"); [[ " $WORLDS " == *" 2 "* ]] && need+=("$launch_bin") ;;
    torch) need+=("$TORCH_PYTHON" "$torch_py"); [[ " $WORLDS " == *" 2 "* ]] && need+=("$TORCHRUN") ;;
    mlx) need+=("$MLX_PYTHON" "$mlx_py" "$OBLAS") ;;
    *) echo "precision: unknown system '$s' in SYSTEMS (ours, torch, mlx)" >&2; exit 2 ;;
  esac
done
for f in "${need[@]}"; do
  [ -e "$f" ] || { echo "precision: $f is missing (see the header of $0)" >&2; exit 2; }
done
for d in $DTYPES; do
  case $d in f32|bf16) ;; *) echo "precision: DTYPES takes f32 and bf16, not '$d'" >&2; exit 2 ;; esac
done
for w in $WORLDS; do
  case $w in 1|2) ;; *) echo "precision: WORLDS takes 1 and 2, not '$w'" >&2; exit 2 ;; esac
done

work="$(mktemp -d)"
# Every run starts in a session of its own (setsid) under `timeout`; on exit,
# Ctrl-C or SIGTERM the trap stops whatever is still running: each run's
# descendants (torchrun's workers, mlx-launch's ranks) and its process group,
# SIGTERM first, SIGKILL 3 s later.
pids=()
descendants() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
cleanup() {
  local p all=()
  for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null || continue
    all+=("$p" $(descendants "$p"))
  done
  if [ ${#all[@]} -gt 0 ]; then
    echo "precision: stopping ${#all[@]} leftover process(es): ${all[*]}" >&2
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    kill -TERM "${all[@]}" 2>/dev/null || true
    sleep 3
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
    kill -KILL "${all[@]}" 2>/dev/null || true
  fi
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "precision: logs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start LOG CMD...: run CMD in the background, in its own session, output to LOG.
start() {
  local log=$1; shift
  setsid timeout -k 10 "$RUN_TIMEOUT" "$@" > "$log" 2>&1 < /dev/null &
  pids+=("$!")
}
# finish: wait for every started run; fails if any did.
finish() {
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  return $rc
}

echo "[[\"127.0.0.1:$MLX_PORT\"],[\"127.0.0.1:$((MLX_PORT + 1))\"]]" > "$work/hf.json"
ours_common=(train --steps "$steps" --eval-every 0 --data offline --global-batch 4 --block-size 512)
torch_common=("$torch_py" --steps "$steps" --time-from "$time_from" $TORCH_ARGS)
mlx_common=("$mlx_py" --steps "$steps" --time-from "$time_from")
have_time=0; [ -x /usr/bin/time ] && have_time=1

# Each run's summary line is shown as it finishes; parse.py turns it into a
# row of $work/rows (system dtype world median tokens/s peak rss loss).
cat > "$work/parse.py" <<'EOF'
import json, re, statistics, sys
system, dtype, world, log, time_from, extra = sys.argv[1:7]
time_from = int(time_from)
text = open(log, errors="replace").read()
tokens_per_step = 4 * 512
def out(med, peak, rss, loss):
    f = lambda v, fmt: "-" if v is None else fmt % v
    print(system, dtype, world, f(med, "%.3f"), f(tokens_per_step / med if med else None, "%.0f"),
          f(peak, "%.0f"), f(rss, "%.0f"), f(loss, "%.4f"))
if system == "ours":
    m = re.search(r"done: \d+ steps, final loss ([0-9.naNinf-]+), median (\d+) ms/step, \d+ tokens/s, peak (\d+) MiB per rank", text)
    if not m:
        sys.exit(1)
    med = float(m.group(2)) / 1000
    summary, timefile = extra.split(",")
    try:
        ms = json.load(open(summary))["step_ms"]
        med = statistics.median(ms[min(time_from, len(ms)) - 1:]) / 1000
    except Exception as e:
        print(f"precision: ours' --summary unreadable ({e}); using its done: line's median (steps 2-N)", file=sys.stderr)
    rss = None
    try:
        rss = int(re.search(r"maxrss_kib (\d+)", open(timefile).read()).group(1)) / 1024
    except Exception:
        pass
    out(med, float(m.group(3)), rss, float(m.group(1)))
else:
    lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
    if not lines:
        sys.exit(1)
    r = json.loads(lines[-1][len("RESULT "):])
    ranks = r["per_rank"]
    rss = max(p["maxrss_MiB"] for p in ranks)
    peak = max(p["peak_mem_MiB"] for p in ranks) if system == "mlx" else rss
    want = {"torch": ("autocast", {"f32": "off", "bf16": "bf16"}), "mlx": ("dtype", {"f32": "float32", "bf16": "bfloat16"})}[system]
    if r.get(want[0]) != want[1][dtype] or r["world"] != int(world):
        print(f"precision: {system} ran {want[0]}={r.get(want[0])} world={r['world']}, not {dtype} world {world}", file=sys.stderr)
        sys.exit(1)
    out(r["median_step_s"], peak, rss, r["loss_last"])
EOF

failed=0
# record SYSTEM DTYPE WORLD LOG [EXTRA]: parse a finished run, or report its failure.
record() {
  local system=$1 dtype=$2 world=$3 log=$4 extra=${5:-,} rc=${6:-0} row
  if [ "$rc" = 0 ] && row=$("$PARSE_PYTHON" "$work/parse.py" "$system" "$dtype" "$world" "$log" "$time_from" "$extra"); then
    echo "$row" >> "$work/rows"
  else
    failed=1
    echo "precision: $system $dtype world $world failed (exit $rc); the end of its log:" >&2
    tail -n 15 "$log" | sed 's/^/    /' >&2
    echo "$system $dtype $world - - - - -" >> "$work/rows"
  fi
}
show() { grep -E "$2" "$1" | tail -n 1 | sed "s/^/$3: /" || true; }

echo "== precision: $steps steps per run, medians over steps $time_from-$steps; systems: $SYSTEMS; worlds: $WORLDS; dtypes: $DTYPES"
for world in $WORLDS; do
  for system in $SYSTEMS; do
    for dtype in $DTYPES; do
      tag="$system $dtype w$world"
      log="$work/${system}_${dtype}_w${world}.log"
      echo "-- $tag, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
      rc=0
      case $system in
        ours)
          summary="$work/ours_${dtype}_w${world}.json"; timefile="$work/ours_${dtype}_w${world}.time"
          cmd=("$ours_bin" "${ours_common[@]}" --dtype "$dtype" --out "$work/ours_${dtype}_w${world}" --fresh --summary "$summary")
          [ "$world" = 2 ] && cmd=("$launch_bin" -n 2 -- "${cmd[@]}")
          [ $have_time = 1 ] && cmd=(/usr/bin/time -f "maxrss_kib %M" -o "$timefile" "${cmd[@]}")
          start "$log" "${cmd[@]}"; finish || rc=$?
          show "$log" "done:" "$tag"
          record ours "$dtype" "$world" "$log" "$summary,$timefile" "$rc"
          ;;
        torch)
          ac=off; [ "$dtype" = bf16 ] && ac=bf16
          if [ "$world" = 1 ]; then
            start "$log" "$TORCH_PYTHON" "${torch_common[@]}" --threads 2 --autocast "$ac"
          else
            start "$log" "$TORCHRUN" --standalone --nproc_per_node 2 "${torch_common[@]}" --threads 1 --autocast "$ac"
          fi
          finish || rc=$?
          show "$log" "^summary:" "$tag"
          record torch "$dtype" "$world" "$log" , "$rc"
          ;;
        mlx)
          dt=float32; [ "$dtype" = bf16 ] && dt=bfloat16
          if [ "$world" = 1 ]; then
            start "$log" env LD_PRELOAD="$OBLAS" "$MLX_PYTHON" "${mlx_common[@]}" --dtype "$dt"
          else
            for r in 0 1; do
              l="$log"; [ $r = 1 ] && l="$work/${system}_${dtype}_w${world}.rank1.log"
              start "$l" env LD_PRELOAD="$OBLAS" MLX_HOSTFILE="$work/hf.json" MLX_RANK=$r \
                "$MLX_PYTHON" "${mlx_common[@]}" --dtype "$dt" --backend ring --grad avg
            done
          fi
          finish || rc=$?
          show "$log" "^summary:" "$tag"
          record mlx "$dtype" "$world" "$log" , "$rc"
          ;;
      esac
    done
  done
done

# One table; for bf16 rows, the speed-up over the same system's f32 at the
# same world size (f32 s/step / bf16 s/step).
echo
awk '
  BEGIN { name["ours"] = "ours"; name["torch"] = "PyTorch"; name["mlx"] = "MLX + OpenBLAS" }
  { row[NR] = $0; if ($2 == "f32" && $4 != "-") f32[$1, $3] = $4 }
  END {
    print "| system | dtype | world | median s/step | tokens/s | peak MiB/rank | RSS MiB/rank | final loss | bf16 vs f32 |"
    print "|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= NR; i++) {
      split(row[i], v, " ")
      sp = "-"
      if (v[2] == "bf16" && v[4] != "-" && (v[1], v[3]) in f32) sp = sprintf("%.2fx", f32[v[1], v[3]] / v[4])
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name[v[1]], v[2], v[3], v[4], v[5], v[6], v[7], v[8], sp
    }
  }' "$work/rows"
echo
echo "Medians over steps $time_from-$steps (at world 2 the slowest rank's for PyTorch and MLX, rank 0's for ours)."
echo "bf16: ours and PyTorch (autocast) keep f32 master weights and AdamW state; MLX runs bf16 weights, gradients and AdamW state (model.set_dtype), loss in f32."
echo "peak MiB/rank: array memory (ours, MLX), resident set (PyTorch); RSS MiB/rank: resident peak for all."
exit $failed
