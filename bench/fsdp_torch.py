#!/usr/bin/env python3
"""PyTorch's data-parallel memory modes on the CPU (gloo): step time and memory per rank.

For a Llama of the given shape (transformers' LlamaForCausalLM, configured like our reference
model: vocab 50257, untied head, RMSNorm eps 1e-5, RoPE base 10000, SDPA attention), trains
random-token batches with AdamW (lr 3e-4, weight decay 0.01, betas (0.9, 0.999), eps 1e-8, as
`mlx-llama train`) under each of these modes, at each world size, spawned with mp.spawn:

  ddp    DistributedDataParallel (gradient_as_bucket_view): everything replicated (the baseline)
  zero1  DDP + ZeroRedundancyOptimizer(AdamW): the optimizer state sharded
  zero2  FSDP2 fully_shard(reshard_after_forward=False) on every decoder layer, then the root:
         parameters stay gathered from forward to backward, gradients are reduce-scattered
  zero3  FSDP2 fully_shard(reshard_after_forward=True) on every decoder layer, then the root

each with or without activation checkpointing (torch.utils.checkpoint of every decoder layer,
use_reentrant=False). Reported per (mode, world, grad_checkpoint): the median step time on
rank 0 (a barrier before and after every step), each rank's peak RSS (ru_maxrss; also its RSS
before the model is built, mostly torch's own libraries, and the peak over that), and the bytes
of parameters, gradients and optimizer state each rank holds after a step (local storage only:
DTensor local shards for FSDP2, the local partition's state for ZeroRedundancyOptimizer). One
JSON line per run on stdout, a table on stderr; a mode that fails reports its error and the
rest go on. Threads per rank: max(1, os.cpu_count() // world).

    ~/torch-venv/bin/python bench/fsdp_torch.py                       # the reference model
    ~/torch-venv/bin/python bench/fsdp_torch.py --layers 2 --dims 64 --mlp 128 --heads 2 \\
        --block 64 --steps 2 --warmup 1 --worlds 2 --grad-checkpoint both
"""
import argparse
import datetime
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig, LlamaForCausalLM

MODES = ("ddp", "zero1", "zero2", "zero3")
VOCAB = 50257
MIB = 1024 * 1024


class Checkpointed(nn.Module):
    """A decoder layer whose activations are recomputed in backward."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args, **kwargs):
        return checkpoint(self.layer, *args, use_reentrant=False, **kwargs)


def build_model(a):
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=a.dims, intermediate_size=a.mlp,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
        tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=max(a.block, 512), attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)  # the same initial weights on every rank
    return LlamaForCausalLM(cfg)


def local(t):
    """The tensor this rank stores: a DTensor's local shard, else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors):
    """Bytes of the distinct storages behind `tensors` (views of one storage counted once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = local(t).untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def optim_tensors(opt):
    inner = opt.optim if hasattr(opt, "optim") else opt  # ZeroRedundancyOptimizer: local AdamW
    return [v for st in inner.state.values() for v in st.values()]


def rss_now_mib():
    """This process's resident memory now (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024


def worker(rank, world, mode, gc, a, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        rss_base = rss_now_mib()  # torch and its libraries, before the model
        model = build_model(a)
        n_params = sum(p.numel() for p in model.parameters())
        layers = model.model.layers
        if gc:
            for i in range(len(layers)):
                layers[i] = Checkpointed(layers[i])
        adamw = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        if mode in ("ddp", "zero1"):
            from torch.nn.parallel import DistributedDataParallel as DDP

            net = DDP(model, gradient_as_bucket_view=True)  # grads live in the buckets: no copy
            if mode == "ddp":
                opt = torch.optim.AdamW(net.parameters(), **adamw)
            else:
                from torch.distributed.optim import ZeroRedundancyOptimizer

                opt = ZeroRedundancyOptimizer(net.parameters(),
                                              optimizer_class=torch.optim.AdamW, **adamw)
        elif mode in ("zero2", "zero3"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            reshard = mode == "zero3"
            for layer in layers:
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
            net = model
            opt = torch.optim.AdamW(model.parameters(), **adamw)
        else:
            raise ValueError(f"unknown mode {mode}")

        gen = torch.Generator().manual_seed(1000 + rank)
        times, loss = [], float("nan")
        for step in range(a.warmup + a.steps):
            x = torch.randint(0, VOCAB, (a.per_rank_batch, a.block), generator=gen)
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out = net(input_ids=x, labels=x)  # HF shifts the labels: causal LM cross entropy
            out.loss.backward()
            opt.step()
            dist.barrier()
            if step >= a.warmup:
                times.append((time.perf_counter() - t0) * 1000)
            loss = out.loss.item()

        params = list(model.parameters())
        mem = dict(params=nbytes(params), grads=nbytes([p.grad for p in params]),
                   optim=nbytes(optim_tensors(opt)))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
        rows = [None] * world
        mine = dict(rss_mib=rss, base=rss_base, **{k: v / MIB for k, v in mem.items()})
        dist.all_gather_object(rows, mine)
        if rank == 0:
            res = dict(
                mode=mode, world=world, grad_checkpoint=gc, threads=threads, torch=torch.__version__,
                layers=a.layers, dims=a.dims, mlp=a.mlp, heads=a.heads, block=a.block,
                per_rank_batch=a.per_rank_batch, warmup=a.warmup, steps=a.steps, n_params=n_params,
                step_ms_median=statistics.median(times), step_ms=[round(t, 1) for t in times],
                tokens_per_s=world * a.per_rank_batch * a.block / (statistics.median(times) / 1000),
                loss_last=loss,
                peak_rss_mib=[round(r["rss_mib"], 1) for r in rows],
                rss_before_model_mib=[round(r["base"], 1) for r in rows],
                param_mib=[round(r["params"], 2) for r in rows],
                grad_mib=[round(r["grads"], 2) for r in rows],
                optim_mib=[round(r["optim"], 2) for r in rows],
                state_mib=[round(r["params"] + r["grads"] + r["optim"], 2) for r in rows])
            with open(os.path.join(out_dir, "result.json"), "w") as f:
                json.dump(res, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(mode, world, gc, a):
    """Spawns `world` ranks for one configuration; its result, or an error record."""
    base = dict(mode=mode, world=world, grad_checkpoint=gc)
    with tempfile.TemporaryDirectory() as d:
        try:
            mp.spawn(worker, args=(world, mode, gc, a, free_port(), d), nprocs=world, join=True)
            with open(os.path.join(d, "result.json")) as f:
                return json.load(f)
        except Exception as e:  # mp.spawn's ProcessRaisedException carries the rank's traceback
            msg = str(e).strip().splitlines()
            err = (msg[-1].strip() if msg else repr(e))[:500]
            done = os.path.join(d, "result.json")
            if os.path.exists(done):  # every step measured and gathered: it failed at teardown
                with open(done) as f:
                    return dict(json.load(f), teardown_error=err)
            return dict(base, error=err, traceback="\n".join(msg[-25:]))


def table(results):
    head = (f"{'mode':<6} {'world':>5} {'gc':>3} {'step ms':>9} {'tok/s':>8} {'rss MiB':>8} {'over base':>9} "
            f"{'param':>7} {'grad':>7} {'optim':>7} {'state MiB/rank':>15}")
    lines = [head, "-" * len(head)]
    for r in results:
        key = f"{r['mode']:<6} {r['world']:>5} {'on' if r['grad_checkpoint'] else 'off':>3}"
        if "error" in r:
            lines.append(f"{key} FAILED: {r['error']}")
            continue
        mx = lambda k: max(r[k])  # noqa: E731 (the largest rank)
        over = max(p - b for p, b in zip(r["peak_rss_mib"], r["rss_before_model_mib"]))
        note = f"  (then at teardown: {r['teardown_error']})" if "teardown_error" in r else ""
        lines.append(f"{key} {r['step_ms_median']:>9.1f} {r['tokens_per_s']:>8.0f} "
                     f"{mx('peak_rss_mib'):>8.1f} {over:>9.1f} {mx('param_mib'):>7.1f} {mx('grad_mib'):>7.1f} "
                     f"{mx('optim_mib'):>7.1f} {mx('state_mib'):>15.1f}{note}")
    lines.append("(per-rank columns: the largest rank; every rank's values are in the JSON lines)")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="ddp,zero1,zero2,zero3")
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dims", type=int, default=256)
    p.add_argument("--mlp", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--per-rank-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--grad-checkpoint", choices=("both", "on", "off"), default="both")
    a = p.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"unknown modes {bad}; choose from {MODES}")
    gcs = {"both": [False, True], "on": [True], "off": [False]}[a.grad_checkpoint]
    results = []
    for world in [int(w) for w in a.worlds.split(",") if w]:
        for mode in modes:
            for gc in gcs:
                r = run_one(mode, world, gc, a)
                results.append(r)
                print(json.dumps(r), flush=True)
                status = f"error: {r['error']}" if "error" in r else f"{r['step_ms_median']:.1f} ms"
                print(f"# {mode} world={world} gc={gc}: {status}", file=sys.stderr, flush=True)
    print(table(results), file=sys.stderr)


if __name__ == "__main__":
    main()
