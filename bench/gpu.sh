#!/usr/bin/env bash
# The wgpu backend on a real GPU beside PyTorch CUDA on the same card (issue
# 25), in phases that each fit one command on a lent GPU machine (10 minutes):
#
#   bench/gpu.sh pack              # here, with Rust: release build, stripped
#                                  # into .gpu-bin/ (git-ignored; carry it)
#   bench/gpu.sh ops OUT           # there: matmul TFLOP/s (f32, f16, bf16) and
#                                  # memory-bound kernels' GB/s, ours and PyTorch's
#   bench/gpu.sh train ref OUT     # there: the reference Llama's training step
#   bench/gpu.sh train large OUT   # there: 12 layers, dims 768, batch 16 x 512
#   bench/gpu.sh profile OUT       # there: MLX_PROFILE=1, per-primitive GPU time
#   bench/gpu.sh conformance OUT   # there: the GPU conformance suites (packed
#                                  # as test binaries) on the real adapter
#   bench/gpu.sh table OUT         # anywhere: Markdown tables from OUT's logs
#
# On the GPU machine (`run` of the device tool, whose working tree is this
# repository's): carry `.gpu-bin` and `.gl` (the Vulkan loader's Debian
# packages, fetched here once as /work/.library/device/README.md says:
# `apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0
# libgles2` into .gl). Every phase that runs on the GPU first unpacks them
# when the machine has no Vulkan loader and points the loader at NVIDIA's
# ICD when none is installed; `bench/gpu.sh vulkan` does only that and prints
# the GPU and the adapter wgpu picks. For example:
#
#   BUNDLE=$OUT bench/gpu.sh ops /tmp/g       # one device call per phase
#
# The device tool empties $OUT before each call and brings back at most 8
# files, so with BUNDLE=DIR a phase ends by writing two files there: its
# logs as DIR/<phase>.tgz and the tables so far as DIR/<phase>.md. Here,
# untar every phase's .tgz into one folder and run `bench/gpu.sh table` on it.
#
# Ours runs through wgpu on Vulkan, PyTorch through CUDA (`python3` there holds
# it). Training: ours `mlx-llama train --device gpu` on the offline corpus
# (f32, bf16 and f16 with f32 master weights), world 2 as two processes on one
# GPU under `mlx-launch -n 2` (the gradients go through the host);
# PyTorch `bench/torch_train_llama.py --device cuda` on random tokens (the
# arithmetic is the same), eager f32 (TF32 off, PyTorch's default for
# matmuls), autocast bf16 and f16 (with a GradScaler), `torch.compile` f32,
# and world 2 as DDP over gloo
# under torchrun on one GPU (NCCL refuses two ranks on one device). Medians
# over steps TIME_FROM..STEPS for all.
#
# Overridable: STEPS (10), TIME_FROM (3), BIN (.gpu-bin, else target/release),
# PYTHON (python3), RUN_TIMEOUT (seconds per run, 420), TORCH_DEVICE (cuda),
# SYSTEMS ("ours torch": `train` runs one of them alone with one name, to
# keep a slow model's phase within one command's 10 minutes).
# SMALL=1 TORCH_DEVICE=cpu tries every phase anywhere (on lavapipe, say):
# sizes divided by 4 and a one-layer model of 64 dims, 64-token blocks.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
STEPS="${STEPS:-10}"
TIME_FROM="${TIME_FROM:-3}"
PYTHON="${PYTHON:-python3}"
RUN_TIMEOUT="${RUN_TIMEOUT:-420}"
BIN="${BIN:-$([ -e .gpu-bin/mlx-llama.xz ] || [ -x .gpu-bin/mlx-llama ] && echo .gpu-bin || echo target/release)}"
TORCH_DEVICE="${TORCH_DEVICE:-cuda}"
SYSTEMS="${SYSTEMS:-ours torch}"
SMALL="${SMALL:-0}"
small=(); block=512; tiny=()
if [ "$SMALL" = 1 ]; then small=(--small); block=64; tiny=(--layers 1 --dims 64 --heads 2 --mlp-dims 128); fi

usage() { sed -n '2,15p' "$0" >&2; exit 2; }
need_out() { [ -n "${1:-}" ] || usage; mkdir -p "$1"; }

# run LOG CMD...: one run under a time limit, its output to LOG and a line
# saying how it ended; a failed run does not stop the phase.
run() {
  local log=$1; shift
  echo "-- $(basename "$log" .log): $*"
  if timeout -k 10 "$RUN_TIMEOUT" "$@" > "$log" 2>&1 < /dev/null; then
    grep -E "^(\[0\] )?(done:|summary:|adapter:)" "$log" | tail -n 1 | sed 's/^/   /' || true
  else
    echo "   failed (exit $?); the end of its log:"; tail -n 8 "$log" | sed 's/^/     /'
  fi
}

# The Vulkan loader from .gl when the machine has none; NVIDIA's ICD (and
# EGL vendor file) when no ICD is installed where the loader looks.
gpu_setup() {
  for z in .gpu-bin/*.xz; do
    [ -e "$z" ] && [ ! -x "${z%.xz}" ] && xz -dc "$z" > "${z%.xz}" && chmod +x "${z%.xz}"
  done
  if ! ldconfig -p | grep -q 'libvulkan.so.1 ' && ls .gl/*.deb > /dev/null 2>&1; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  local nv=/usr/local/nvidia/share
  if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json > /dev/null 2>&1 \
      && [ -e "$nv/vulkan/icd.d/nvidia_icd.json" ]; then
    export VK_DRIVER_FILES="$nv/vulkan/icd.d/nvidia_icd.json"
    export __EGL_VENDOR_LIBRARY_FILENAMES="$nv/glvnd/egl_vendor.d/10_nvidia.json"
  fi
}

case "${1:-}" in
  ops|train|profile|vulkan|conformance) gpu_setup ;;
esac
case "${1:-}" in
  pack)
    cargo build --release -p mlx-llama -p mlx-dist -p mlx-array \
      --bin mlx-llama --bin mlx-launch --example gpu_bench --example gpu_dispatch_bench
    mkdir -p .gpu-bin "$(dirname "$(git rev-parse --git-path info/exclude)")"
    for b in mlx-llama mlx-launch examples/gpu_bench examples/gpu_dispatch_bench; do
      strip -o ".gpu-bin/$(basename "$b")" "target/release/$b"
      # Compressed, so that all of .gpu-bin fits what the device tool
      # carries (64 MiB); every phase there unpacks it first.
      xz -f -T2 ".gpu-bin/$(basename "$b")"
    done
    # Both folders travel to the GPU machine as `carry`, never as commits.
    exclude="$(git rev-parse --git-path info/exclude)"
    for d in /.gpu-bin/ /.gl/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
    if ! ls .gl/*.deb > /dev/null 2>&1 && command -v apt-get > /dev/null; then
      o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
      mkdir -p .gl /tmp/amd64/partial
      apt-get "${o[@]}" update > /dev/null
      (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    fi
    # The GPU conformance suites as test binaries (dev profile, as CI builds
    # them), stripped and xz-compressed: with the release binaries they would
    # pass the device tool's 64 MiB for what travels. `conformance` runs them.
    mkdir -p .gpu-bin/tests
    cargo test --no-run --message-format=json -p mlx-array -p mlx-optim -p mlx-llama \
        --test conformance --test gpu_conformance --test gpu --test transfers 2>/dev/null \
      | "$PYTHON" -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["package_id"].split("#")[0].split("/")[-1], m["executable"])' \
      | while read -r name pkg exe; do
          strip -o ".gpu-bin/tests/${pkg}_$name" "$exe"
          xz -f -T2 ".gpu-bin/tests/${pkg}_$name"
        done
    du -sh .gpu-bin/* .gpu-bin/tests/* .gl
    ;;
  conformance)
    # The GPU conformance suites on this adapter, failing (not skipping)
    # without one; each suite's log goes to OUT.
    need_out "${2:-}"; out=$2
    for t in .gpu-bin/tests/*.xz; do
      exe="/tmp/$(basename "$t" .xz)"
      xz -dc "$t" > "$exe" && chmod +x "$exe"
      run "$out/test_$(basename "$exe").log" env CI=1 MLX_REQUIRE_GPU=1 "$exe" --test-threads 4
      grep -E "^test result|FAILED|panicked" "$out/test_$(basename "$exe").log" | head -n 12 | sed 's/^/   /' || true
    done
    ;;
  vulkan)
    echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-unset, the loader searches its default folders}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    "$BIN/gpu_bench" --small | head -n 2
    ;;
  ops)
    need_out "${2:-}"; out=$2
    for d in f32 f16 bf16; do
      run "$out/ops_ours_$d.log" "$BIN/gpu_bench" --dtype "$d" "${small[@]}"
    done
    run "$out/ops_torch.log" "$PYTHON" bench/torch_gpu_ops.py --device "$TORCH_DEVICE" "${small[@]}"
    ;;
  train)
    model=${2:-}; need_out "${3:-}"; out=$3
    case $model in
      ref) dims=(); batch=4 ;;
      large) dims=(--layers 12 --dims 768 --heads 12 --mlp-dims 2048); batch=16 ;;
      *) usage ;;
    esac
    [ "$SMALL" = 1 ] && dims=("${tiny[@]}")
    ours=("$BIN/mlx-llama" train --steps "$STEPS" --eval-every 0 --data offline --device gpu
      --global-batch "$batch" --block-size "$block" --fresh "${dims[@]}")
    if [[ " $SYSTEMS " == *" ours "* ]]; then
      for d in f32 bf16 f16; do
        run "$out/train_${model}_ours_lazy_${d}_w1.log" "${ours[@]}" --dtype "$d" \
          --out "$out/run_${model}_$d" --summary "$out/train_${model}_ours_lazy_${d}_w1.json"
      done
      for d in f32 bf16; do
        run "$out/train_${model}_ours_lazy_${d}_w2.log" "$BIN/mlx-launch" -n 2 -- "${ours[@]}" --dtype "$d" \
          --out "$out/run_${model}_${d}_w2" --summary "$out/train_${model}_ours_lazy_${d}_w2.json"
      done
    fi
    if [[ " $SYSTEMS " == *" torch "* ]]; then
      torch=(bench/torch_train_llama.py --device "$TORCH_DEVICE" --steps "$STEPS" --time-from "$TIME_FROM"
        --global-batch "$batch" --block "$block" "${dims[@]}")
      run "$out/train_${model}_torch_eager_f32_w1.log" "$PYTHON" "${torch[@]}"
      run "$out/train_${model}_torch_eager_bf16_w1.log" "$PYTHON" "${torch[@]}" --autocast bf16
      run "$out/train_${model}_torch_eager_f16_w1.log" "$PYTHON" "${torch[@]}" --autocast f16
      run "$out/train_${model}_torch_compile_f32_w1.log" "$PYTHON" "${torch[@]}" --compile
      run "$out/train_${model}_torch_eager_f32_w2.log" "$PYTHON" -m torch.distributed.run \
        --standalone --nproc_per_node 2 "${torch[@]}" --dist-backend gloo
    fi
    # The run folders hold checkpoints (hundreds of MB for the large model).
    rm -rf "$out"/run_*
    ;;
  profile)
    need_out "${2:-}"; out=$2
    for d in f32 bf16; do
      run "$out/profile_ours_$d.log" env MLX_PROFILE=1 "$BIN/mlx-llama" train --steps 4 --eval-every 0 \
        --data offline --device gpu --dtype "$d" --out "$out/run_profile_$d" --fresh \
        --block-size "$block" "${tiny[@]}"
    done
    rm -rf "$out"/run_*
    ;;
  table)
    need_out "${2:-}"
    "$PYTHON" bench/gpu_table.py "$2" --time-from "$TIME_FROM"
    ;;
  *) usage ;;
esac

# BUNDLE=DIR: the phase's logs and tables as two files in DIR (see the top).
if [ -n "${BUNDLE:-}" ] && [ -n "${out:-}" ]; then
  name="$1${model:+-$model}"
  mkdir -p "$BUNDLE"
  "$PYTHON" bench/gpu_table.py "$out" --time-from "$TIME_FROM" > "$BUNDLE/$name.md" || true
  tar czf "$BUNDLE/$name.tgz" -C "$out" .
  echo "bundled: $BUNDLE/$name.tgz, $BUNDLE/$name.md"
fi
