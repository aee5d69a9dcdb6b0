#!/usr/bin/env python3
"""Checks `mlx-llama export` with the real libraries: loads the hf export
with transformers' LlamaForCausalLM (+ AutoTokenizer) and the mlx export
with mlx_lm.load, runs each on the token ids of a fixed prompt, and compares
their logits with ours (mlx-llama's examples/logits). Prints one JSON line
per library and a summary; exits 1 if a difference exceeds --tolerance or a
tokenizer's ids differ from ours.

transformers and mlx-lm live in different virtual environments here, so
each library runs in its own interpreter (--torch-python, --mlx-python),
this same script with --part.

    cargo build -p mlx-llama --bin mlx-llama --example logits
    target/debug/mlx-llama train --steps 20 --data offline --out /tmp/exp-run --fresh \\
        --layers 2 --dims 64 --heads 4 --mlp-dims 128 --block-size 128
    target/debug/mlx-llama export --checkpoint /tmp/exp-run --out /tmp/exp-hf --format hf
    target/debug/mlx-llama export --checkpoint /tmp/exp-run --out /tmp/exp-mlx --format mlx
    python3 bench/export_check.py --run /tmp/exp-run --hf /tmp/exp-hf --mlx /tmp/exp-mlx
"""

import argparse
import json
import os
import subprocess
import sys

PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside."


def part_hf(folder, text, ids):
    """transformers: AutoTokenizer's ids of `text`, LlamaForCausalLM's logits of `ids`."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return {
        "library": "transformers " + __import__("transformers").__version__,
        "ids": tokenizer(text)["input_ids"],
        "logits": logits.tolist(),
    }


def part_mlx(folder, text, ids):
    """mlx-lm: its tokenizer's ids of `text`, its model's logits of `ids`."""
    import mlx.core as mx
    import mlx_lm

    model, tokenizer = mlx_lm.load(folder)
    logits = model(mx.array([ids]))[0].astype(mx.float32)
    return {
        "library": "mlx-lm " + mlx_lm.__version__,
        "ids": tokenizer.encode(text),
        "logits": logits.tolist(),
    }


def max_abs_diff(a, b):
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        raise SystemExit(f"logits of different shapes: {len(a)} rows against {len(b)}")
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def run_part(python, part, folder, text, ids):
    cmd = [python, os.path.abspath(__file__), "--part", part, "--folder", folder,
           "--text", text, "--ids", ",".join(map(str, ids))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="run or checkpoint folder the exports came from")
    p.add_argument("--hf", help="the hf export")
    p.add_argument("--mlx", help="the mlx export")
    p.add_argument("--text", default=PROMPT)
    p.add_argument("--ours", default="target/debug/examples/logits",
                   help="mlx-llama's logits example")
    p.add_argument("--torch-python", default=os.path.expanduser("~/torch-venv/bin/python"))
    p.add_argument("--mlx-python", default=os.path.expanduser("~/mlx-venv/bin/python"))
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--part", choices=["hf", "mlx"], help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.part:
        ids = [int(i) for i in a.ids.split(",")]
        result = (part_hf if a.part == "hf" else part_mlx)(a.folder, a.text, ids)
        print(json.dumps(result))
        return 0

    if not (a.run and a.hf and a.mlx):
        p.error("--run, --hf and --mlx are required")
    ours = json.loads(subprocess.run(
        [a.ours, "--checkpoint", a.run, "--text", a.text],
        check=True, capture_output=True, text=True).stdout)
    ids = ours["ids"]
    ok = True
    summary = {"text": a.text, "tokens": len(ids), "vocab": len(ours["logits"][0])}
    for name, python, folder in [("hf", a.torch_python, a.hf), ("mlx", a.mlx_python, a.mlx)]:
        theirs = run_part(python, name, folder, a.text, ids)
        diff = max_abs_diff(theirs["logits"], ours["logits"])
        same_ids = theirs["ids"] == ids
        ok &= diff <= a.tolerance and same_ids
        summary[name] = {"library": theirs["library"], "max_abs_diff": diff,
                         "max_abs_logit": max(abs(x) for r in ours["logits"] for x in r),
                         "tokenizer_ids_equal": same_ids}
        if not same_ids:
            summary[name]["their_ids"] = theirs["ids"]
            summary[name]["our_ids"] = ids
        print(json.dumps({name: summary[name]}))
    print(json.dumps(summary, indent=2))
    print("OK" if ok else f"FAILED (tolerance {a.tolerance})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
