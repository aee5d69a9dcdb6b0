"""Training-step anchor: small Llama in the style of ml-explore/mlx-examples llama
(RMSNorm, RoPE, attention with additive causal mask, SwiGLU MLP), AdamW, random tokens.

Copied from ../shared/anchors/mlx/train_llama.py for bench/precision.sh; the one addition is
`--dtype bfloat16|float32` (default float32, which is the anchor unchanged):

  --dtype bfloat16: after the (seeded, float32) initialisation the model's parameters are cast to
                    bfloat16 with model.set_dtype(mx.bfloat16), and the logits are cast to float32
                    before the cross-entropy (as mlx-lm's trainer does), so the loss is float32.
                    MLX has no float32 master-weight (autocast-style) mode out of the box: the
                    weights, the gradients, the gradient all_sum and AdamW's state (created with
                    the parameters' dtype) are all bfloat16. This is what MLX users run when they
                    train in bfloat16; it is not the same recipe as PyTorch's autocast or ours
                    (float32 master weights and AdamW state), and it needs half the parameter and
                    optimizer memory. On this CPU MLX's bfloat16 matmul does not go through the
                    (preloaded) BLAS: a 512x256 @ 256x50257 product ran at 3.8 GFLOP/s in bfloat16
                    beside 56 in float32, and a bfloat16 training step takes ~9x a float32 one.

Run with OpenBLAS preloaded (LD_PRELOAD=$OBLAS; see ../shared/anchors/README.md).
Single process:   python mlx_train_llama.py --steps 10 --time-from 3 [--dtype bfloat16]
Two ranks (ring, started directly): MLX_HOSTFILE=hf.json MLX_RANK=r python mlx_train_llama.py
                  --steps 10 --time-from 3 --backend ring --grad avg [--dtype bfloat16]
                  (hf.json: [["127.0.0.1:42323"],["127.0.0.1:42324"]])
Data parallel:    mlx.launch -n 2 --backend ring --python venv/bin/python -- mlx_train_llama.py --grad avg
  --grad avg      : nn.average_gradients (MLX's bucketed all_sum)
  --grad treemap  : tree_map(lambda g: all_sum(g) / N, grads)  (one all_sum per tensor)
  --per-rank-batch: sequences per rank (default: global batch / N, i.e. split the global batch of 4)
"""
import argparse
import json
import math
import os
import resource
import statistics
import time

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map


class LlamaAttention(nn.Module):
    def __init__(self, dims: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.rope = nn.RoPE(dims // num_heads, traditional=True)
        self.query_proj = nn.Linear(dims, dims, bias=False)
        self.key_proj = nn.Linear(dims, dims, bias=False)
        self.value_proj = nn.Linear(dims, dims, bias=False)
        self.out_proj = nn.Linear(dims, dims, bias=False)

    def __call__(self, queries, keys, values, mask=None):
        queries = self.query_proj(queries)
        keys = self.key_proj(keys)
        values = self.value_proj(values)
        num_heads = self.num_heads
        B, L, D = queries.shape
        queries = queries.reshape(B, L, num_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.reshape(B, L, num_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(B, L, num_heads, -1).transpose(0, 2, 1, 3)
        queries = self.rope(queries)
        keys = self.rope(keys)
        scale = math.sqrt(1 / queries.shape[-1])
        scores = (queries * scale) @ keys.transpose(0, 1, 3, 2)
        if mask is not None:
            scores = scores + mask
        scores = mx.softmax(scores, axis=-1)
        values_hat = (scores @ values).transpose(0, 2, 1, 3).reshape(B, L, -1)
        return self.out_proj(values_hat)


class LlamaEncoderLayer(nn.Module):
    def __init__(self, dims: int, mlp_dims: int, num_heads: int):
        super().__init__()
        self.attention = LlamaAttention(dims, num_heads)
        self.norm1 = nn.RMSNorm(dims)
        self.norm2 = nn.RMSNorm(dims)
        self.linear1 = nn.Linear(dims, mlp_dims, bias=False)
        self.linear2 = nn.Linear(dims, mlp_dims, bias=False)
        self.linear3 = nn.Linear(mlp_dims, dims, bias=False)

    def __call__(self, x, mask=None):
        y = self.norm1(x)
        y = self.attention(y, y, y, mask)
        x = x + y
        y = self.norm2(x)
        a = self.linear1(y)
        b = self.linear2(y)
        y = a * mx.sigmoid(a) * b  # SwiGLU
        y = self.linear3(y)
        return x + y


class Llama(nn.Module):
    def __init__(self, num_layers, vocab_size, dims, mlp_dims, num_heads):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dims)
        self.layers = [LlamaEncoderLayer(dims, mlp_dims, num_heads) for _ in range(num_layers)]
        self.norm = nn.RMSNorm(dims)
        self.out_proj = nn.Linear(dims, vocab_size, bias=False)

    def __call__(self, x):
        mask = nn.MultiHeadAttention.create_additive_causal_mask(x.shape[1])
        mask = mask.astype(self.embedding.weight.dtype)
        x = self.embedding(x)
        for l in self.layers:
            x = l(x, mask)
        x = self.norm(x)
        return self.out_proj(x)


def cpu_times():
    t = os.times()
    return t.user + t.system


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--per-rank-batch", type=int, default=0, help="0 = global_batch / world")
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--grad", choices=["avg", "treemap"], default="avg")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="")
    p.add_argument("--backend", default="any", help="mx.distributed.init backend: any|ring|mpi")
    p.add_argument("--json", default="")
    p.add_argument("--time-from", type=int, default=5, help="median over steps [time_from, steps] (1-based)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: model.set_dtype(mx.bfloat16) (no f32 master weights), loss in float32")
    args = p.parse_args()
    bf16 = args.dtype == "bfloat16"

    group = mx.distributed.init(backend=args.backend)
    rank, world = group.rank(), group.size()
    per_rank = args.per_rank_batch or args.global_batch // world
    global_batch = per_rank * world

    # identical init on every rank (fixed seed)
    mx.random.seed(args.seed)
    model = Llama(num_layers=4, vocab_size=50257, dims=256, mlp_dims=512, num_heads=4)
    mx.eval(model.parameters())
    if bf16:
        # what MLX users do: the whole model in bfloat16 (MLX has no f32 master-weight mode)
        model.set_dtype(mx.bfloat16)
        mx.eval(model.parameters())
    param_dtypes = sorted({str(v.dtype).replace("mlx.core.", "") for _, v in tree_flatten(model.parameters())})
    nparams = sum(v.size for _, v in tree_flatten(model.parameters()))
    optimizer = optim.AdamW(learning_rate=3e-4)

    # random token ids from a fixed seed; the global batch for step s is data[s],
    # rank r takes rows [r*per_rank, (r+1)*per_rank)
    rng = np.random.RandomState(args.seed)
    data = rng.randint(0, 50257, size=(args.steps, global_batch, args.block + 1)).astype(np.int32)

    def loss_fn(model, x, y):
        logits = model(x)
        if bf16:
            logits = logits.astype(mx.float32)  # as mlx-lm: the loss in float32
        return nn.losses.cross_entropy(logits, y).mean()

    loss_and_grad = nn.value_and_grad(model, loss_fn)

    if world > 1:
        if args.grad == "avg":
            reduce_grads = nn.average_gradients
        else:
            reduce_grads = lambda g: tree_map(lambda t: mx.distributed.all_sum(t) / world, g)
    else:
        reduce_grads = lambda g: g

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        grads = reduce_grads(grads)
        optimizer.update(model, grads)
        return loss

    times, losses = [], []
    cpu0, wall0 = None, None
    for s in range(args.steps):
        b = data[s, rank * per_rank:(rank + 1) * per_rank]
        x = mx.array(b[:, :-1])
        y = mx.array(b[:, 1:])
        if s + 1 == args.time_from:
            cpu0, wall0 = cpu_times(), time.perf_counter()
        t0 = time.perf_counter()
        loss = step(x, y)
        mx.eval(loss, model.parameters(), optimizer.state)
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(loss.item())
        if rank == 0:
            print(f"[{args.tag}] step {s + 1:3d} loss {losses[-1]:.4f} time {dt:.3f}s", flush=True)
    cpu_util = (cpu_times() - cpu0) / (time.perf_counter() - wall0) if cpu0 is not None else float("nan")

    timed = times[args.time_from - 1:]
    med = statistics.median(timed)
    nthreads = len(os.listdir("/proc/self/task"))
    peak_mem = mx.get_peak_memory()
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    # gather per-rank stats to rank 0
    stats = mx.array([med, peak_mem / 2**20, maxrss_kib / 1024, losses[-1], losses[0], times[0], cpu_util, nthreads],
                     dtype=mx.float32)
    if world > 1:
        allstats = mx.distributed.all_gather(stats.reshape(1, -1))
    else:
        allstats = stats.reshape(1, -1)
    allstats = np.array(allstats.tolist())

    if rank == 0:
        tokens_per_step = global_batch * args.block
        med_world = float(allstats[:, 0].max())
        res = dict(
            tag=args.tag, dtype=args.dtype, param_dtypes=param_dtypes,
            adamw_state_dtypes=sorted({str(v.dtype).replace("mlx.core.", "")
                                       for k, v in tree_flatten(optimizer.state) if k.endswith((".m", ".v"))}),
            world=world, per_rank_batch=per_rank, global_batch=global_batch, block=args.block,
            grad=args.grad if world > 1 else "none", nparams=int(nparams), steps=args.steps,
            first_step_s=float(allstats[:, 5].max()),
            median_step_s=med_world,
            step_min_s=min(timed), step_max_s=max(timed),
            tokens_per_s=tokens_per_step / med_world,
            loss_step1=float(allstats[:, 4].mean()),
            loss_last=float(allstats[:, 3].mean()),
            per_rank=[dict(rank=i, median_step_s=r[0], peak_mem_MiB=r[1], maxrss_MiB=r[2], loss_last=r[3],
                           cpu_util=r[6], threads=int(r[7])) for i, r in enumerate(allstats)],
            mlx=mx.__version__, ld_preload=os.environ.get("LD_PRELOAD", ""),
        )
        print(f"summary: dtype {args.dtype} (parameters {'/'.join(res['param_dtypes'])}, AdamW state "
              f"{'/'.join(res['adamw_state_dtypes'])}, loss float32), world {world}, median {med_world:.3f} s/step "
              f"over steps {args.time_from}-{args.steps}, {res['tokens_per_s']:.0f} tokens/s, peak "
              f"{max(r['peak_mem_MiB'] for r in res['per_rank']):.0f} MiB arrays / "
              f"{max(r['maxrss_MiB'] for r in res['per_rank']):.0f} MiB RSS per rank (max)", flush=True)
        print("RESULT " + json.dumps(res), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
