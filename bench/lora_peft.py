#!/usr/bin/env python3
"""LoRA fine-tuning with PEFT + PyTorch on the CPU, for bench/lora.sh.

A plain loop: the HF Llama folder `--model`, PEFT's LoRA on the given
projections of the last `--layers` blocks (`layers_to_transform`), AdamW on
the adapters only, batches of `--batch` rows of the JSON Lines `{"text"}`
file, each tokenized and cut to `--seq` tokens (rows are longer), the loss
over every token as mlx-lm's and ours. `--full` trains every weight instead.
Prints one line `RESULT {...}` with the median step time over the steps after
`--time-from` and the peak RSS.

    ~/torch-venv/bin/python bench/lora_peft.py --model HF_DIR --data train.jsonl \
        --rank 8 --alpha 16 --layers 4 --targets q,k,v,o,gate,up,down \
        --batch 4 --seq 256 --steps 12 --time-from 3
"""
import argparse
import json
import resource
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoTokenizer, LlamaForCausalLM

NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
         "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--data", required=True)
p.add_argument("--rank", type=int, default=8)
p.add_argument("--alpha", type=float, default=16)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--targets", default="q,k,v,o,gate,up,down")
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--time-from", type=int, default=3)
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--threads", type=int, default=0)
p.add_argument("--full", action="store_true")
a = p.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)

tok = AutoTokenizer.from_pretrained(a.model)
rows = [json.loads(line)["text"] for line in open(a.data)]
ids = [tok(r)["input_ids"][: a.seq] for r in rows]
ids = [x for x in ids if len(x) == a.seq]
assert len(ids) >= a.batch, f"only {len(ids)} rows of {a.seq} tokens"

model = LlamaForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
n_layers = model.config.num_hidden_layers
if not a.full:
    cfg = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0,
                     target_modules=[NAMES[t] for t in a.targets.split(",")],
                     layers_to_transform=list(range(n_layers - a.layers, n_layers)),
                     task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
trainable = [q for q in model.parameters() if q.requires_grad]
opt = torch.optim.AdamW(trainable, lr=a.lr, weight_decay=0.0)
model.train()

times, losses = [], []
for step in range(a.steps):
    b = [ids[(step * a.batch + i) % len(ids)] for i in range(a.batch)]
    x = torch.tensor(b)
    t = time.perf_counter()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
    times.append(time.perf_counter() - t)
print("RESULT " + json.dumps({
    "median_step_s": statistics.median(times[a.time_from - 1:]),
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "trainable": sum(q.numel() for q in trainable),
    "losses": [round(v, 4) for v in losses],
}), flush=True)
