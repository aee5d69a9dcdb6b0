#!/usr/bin/env python3
"""Markdown tables from the logs `bench/gpu.sh` leaves in OUT: ours beside PyTorch on one GPU.

    bench/gpu_table.py OUT [--time-from 3]

Reads what is there and skips what is not:
  ops_ours_{f32,f16,bf16}.log   gpu_bench's `RESULT {json}` (mlx-array/examples/gpu_bench.rs)
  ops_torch.log                 bench/torch_gpu_ops.py's `RESULT {json}`
  train_<model>_<system>_<variant>_<dtype>_w<world>.log (and .json for ours: --summary)
and prints:
  matmul TFLOP/s per shape: ours and PyTorch in f32 (PyTorch with TF32 off), f16 and bf16, ours over
      PyTorch; PyTorch with TF32 on, for information
  memory-bound kernels in f32, GB/s, ours and PyTorch, with PyTorch's device-to-device copy as the
      ceiling
  the Llama-like block's forward+backward, ms
  training: median s/step over steps --time-from..N (ours from rank 0's per-step times, PyTorch from
      its RESULT, the slowest rank), tokens/s, peak GPU memory per rank (ours: array memory; PyTorch:
      torch.cuda.max_memory_allocated), and the step time over PyTorch eager f32's at the same model
      and world.
"""
import argparse
import glob
import json
import os
import re
import statistics

SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def result_line(path):
    """The last `RESULT {json}` object in a log, or None."""
    if not os.path.exists(path):
        return None
    lines = [l for l in open(path, errors="replace") if l.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def ops_tables(out):
    ours = {}
    adapter = None
    for d in ("f32", "f16", "bf16"):
        r = result_line(os.path.join(out, f"ops_ours_{d}.log"))
        if r:
            adapter = r["adapter"]
            for x in r["results"]:
                ours[(x["kind"], x["name"], SHORT.get(r["dtype"], r["dtype"]))] = x
    t = result_line(os.path.join(out, "ops_torch.log"))
    torch = {(x["kind"], x["name"], x["dtype"]): x for x in (t or {}).get("results", [])}
    if not ours and not torch:
        return
    print(f"Ours: wgpu adapter `{adapter}`. PyTorch: {t and t.get('gpu_name')}, torch {t and t.get('torch')}, "
          f"CUDA {t and t.get('cuda')}.\n")
    names = []
    for (kind, name, _) in list(ours) + list(torch):
        if kind == "matmul" and name not in names:
            names.append(name)
    print("| matmul, TFLOP/s | ours f32 | PyTorch f32 | ours / PyTorch | ours f16 | PyTorch f16 | ours / PyTorch"
          " | ours bf16 | PyTorch bf16 | ours / PyTorch | PyTorch TF32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        cells = []
        for d in ("f32", "f16", "bf16"):
            o = ours.get(("matmul", name, d), {}).get("tflops")
            p = torch.get(("matmul", name, d), {}).get("tflops")
            cells += [fmt(o, ".3g"), fmt(p, ".3g"), fmt(ratio(o, p), ".0%")]
        cells.append(fmt(torch.get(("matmul", name, "tf32"), {}).get("tflops"), ".3g"))
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    copy = torch.get(("memory", "copy", "f32"), {}).get("gbs")
    elements = next((x["elements"] for (k, _, d), x in list(ours.items()) + list(torch.items())
                     if k == "memory" and d == "f32"), 0)
    print(f"| f32, {elements:,} elements | ours GB/s | PyTorch GB/s | ours / PyTorch | ours / PyTorch's copy |")
    print("|---|---|---|---|---|")
    if copy:
        print(f"| device-to-device copy (PyTorch) | - | {copy:.3g} | - | - |")
    kernels = []
    for (kind, name, d) in list(ours) + list(torch):
        if kind == "memory" and d == "f32" and name != "copy" and name not in kernels:
            kernels.append(name)
    for name in kernels:
        o = ours.get(("memory", name, "f32"), {}).get("gbs")
        p = torch.get(("memory", name, "f32"), {}).get("gbs")
        print(f"| {name} | {fmt(o, '.3g')} | {fmt(p, '.3g')} | {fmt(ratio(o, p), '.0%')} | {fmt(ratio(o, copy), '.0%')} |")
    print()
    print("| Llama-like block fwd+bwd, ms | ours | PyTorch | ours / PyTorch time |")
    print("|---|---|---|---|")
    for d in ("f32", "f16", "bf16"):
        o = ours.get(("block", "llama-like block fwd+bwd", d), {}).get("seconds")
        p = torch.get(("block", "llama-like block fwd+bwd", d), {}).get("seconds")
        if o or p:
            print(f"| {d} | {fmt(o and o * 1e3, '.2f')} | {fmt(p and p * 1e3, '.2f')} | {fmt(ratio(o, p), '.2f')}x |")
    print()


def train_rows(out, time_from):
    rows = []
    for log in sorted(glob.glob(os.path.join(out, "train_*.log"))):
        m = re.match(r"train_(\w+?)_(ours|torch)_(\w+?)_(f32|bf16|f16)_w(\d+)\.log$", os.path.basename(log))
        if not m:
            continue
        model, system, variant, dtype, world = m.groups()
        med = peak = tokens = None
        if system == "ours":
            try:
                s = json.load(open(log[:-4] + ".json"))
                ms = s["step_ms"]
                med = statistics.median(ms[min(time_from, len(ms)) - 1:]) / 1e3
                peak = s["peak_mib"]
                # The summary's tokens/s is tokens per step over its median_ms.
                tokens = round(s["tokens_per_s"] * s["median_ms"] / 1e3)
            except (OSError, ValueError, KeyError):
                pass
        else:
            r = result_line(log)
            if r:
                med = r["median_step_s"]
                peak = r.get("cuda_peak_MiB")
                tokens = r["global_batch"] * r["block"]
        rows.append(dict(model=model, system=system, variant=variant, dtype=dtype, world=int(world),
                         med=med, peak=peak, tokens=tokens))
    order = {"f32": 0, "bf16": 1, "f16": 2}
    rows.sort(key=lambda r: (r["model"] != "ref", r["model"], r["world"], r["system"] != "ours",
                             r["variant"], order[r["dtype"]]))
    return rows


def train_table(rows):
    if not rows:
        return
    base = {(r["model"], r["world"]): r["med"] for r in rows
            if r["system"] == "torch" and r["variant"] == "eager" and r["dtype"] == "f32"}
    name = {"ours": "ours", "torch": "PyTorch"}
    print("| model | system | mode | dtype | world | median s/step | tokens/s | peak GPU MiB/rank |"
          " time / PyTorch eager f32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tps = r["tokens"] / r["med"] if r["tokens"] and r["med"] else None
        rel = ratio(r["med"], base.get((r["model"], r["world"])))
        print(f"| {r['model']} | {name[r['system']]} | {r['variant']} | {r['dtype']} | {r['world']} | "
              f"{fmt(r['med'], '.4f')} | {fmt(tps, '.0f')} | {fmt(r['peak'], '.0f')} | {fmt(rel, '.2f')}x |")
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--time-from", type=int, default=3)
    a = p.parse_args()
    ops_tables(a.out)
    train_table(train_rows(a.out, a.time_from))


if __name__ == "__main__":
    main()
