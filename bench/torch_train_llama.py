"""Training-step anchor, PyTorch port of ../mlx/train_llama.py (mlx-examples-style Llama:
RMSNorm, traditional RoPE, attention with additive causal mask, SwiGLU MLP), AdamW, random tokens.

Copied from ../shared/anchors/torch/train_llama.py for bench/precision.sh. With no new flag it is the anchor
unchanged (CPU, the reference model: 4 layers, dims 256, 4 heads, MLP 512, vocab 50257, batch 4 x 512;
same losses bit for bit). Additions:

  --autocast bf16 : the forward and the loss run under torch.autocast(device_type=<--device>,
                    dtype=torch.bfloat16), as PyTorch users train in mixed precision: float32 master
                    weights, float32 gradients and float32 AdamW state; no GradScaler (bf16 has
                    float32's range). On the CPU autocast runs linear/matmul in bfloat16 and
                    cross_entropy in float32 (on the bfloat16 logits); other ops follow type promotion:
                    the residual stream, the RMSNorms, scores + float32 mask and the softmax stay
                    float32, RoPE and the SwiGLU product run in bfloat16 (CUDA's autocast lists differ in
                    detail; the RESULT records the logits' and the loss's dtypes). backward() and
                    optimizer.step() run outside the autocast region, as the PyTorch AMP recipe says.
  --autocast f16  : the same in float16, WITH a torch.amp.GradScaler (loss scaled before backward, the
                    gradients unscaled and checked for inf/nan in scaler.step, which skips such a step;
                    scaler.update() then adapts the scale). Meant for cuda (it also runs on the CPU).
  --device cuda   : model, data and AdamW state on cuda:(LOCAL_RANK % device count), so every rank on
                    cuda:0 of a one-GPU machine. The model is built on the CPU from the seed and moved
                    (identical initial weights on both devices); the RoPE tables, plain attributes that
                    Module.to() does not move, are moved explicitly (Llama.to_device); the causal mask is
                    made on the tokens' device. Each step's tokens are copied to the GPU before the clock
                    starts, and torch.cuda.synchronize() runs before the clock is read. float32 matmuls
                    are IEEE float32 (TF32 off: allow_tf32 = False, set_float32_matmul_precision
                    ("highest")) unless --tf32. The RESULT adds cuda_peak_MiB
                    (torch.cuda.max_memory_allocated; ru_maxrss is still reported per rank).
  --layers --dims --heads --mlp-dims : the model's size (defaults 4, 256, 4, 512: the reference model).
                    The larger model of the GPU runs: --layers 12 --dims 768 --heads 12 --mlp-dims 2048
                    (GPT-2-small's depth and width, head size 64; MLP 2048 is our choice, about 8/3 x 768
                    as Llama sizes SwiGLU) with --global-batch 16 --block 512: 162 M parameters
                    (77 M of them the embedding and output projection).
  --dist-backend gloo|nccl : torchrun's process group (default gloo, the anchor's). For two ranks on ONE
                    GPU use gloo: NCCL refuses two ranks on the same device, while gloo takes CUDA
                    tensors and all-reduces the gradients through host memory (so world 2 on one GPU
                    measures that copy too, not GPU-to-GPU communication). nccl is for one GPU per rank.
  --compile       : wrap the model (the DDP wrapper under torchrun) in torch.compile (inductor: C++ on
                    the CPU, Triton on cuda); step 1 includes the compilation, so keep --time-from >= 2.

Single process:   python torch_train_llama.py --threads 2 --steps 10 --time-from 3 [--autocast bf16]
Data parallel:    torchrun --standalone --nproc_per_node 2 torch_train_llama.py --threads 1 --steps 10 --time-from 3 [--autocast bf16]
                  (gloo backend, DistributedDataParallel; global batch 4 is split 2+2 across ranks)
On one GPU:       python3 torch_train_llama.py --device cuda --steps 20 --time-from 5 [--autocast bf16|f16] [--compile]
                  python3 -m torch.distributed.run --standalone --nproc_per_node 2 torch_train_llama.py \
                      --device cuda --steps 20 --time-from 5 [--autocast bf16]      (both ranks on cuda:0, gloo)
                  larger model: add --layers 12 --dims 768 --heads 12 --mlp-dims 2048 --global-batch 16 --block 512
"""
import argparse
import json
import math
import os
import resource
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    # mx.fast.rms_norm: x * rsqrt(mean(x^2) + eps) * weight
    def __init__(self, dims: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dims))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RoPE(nn.Module):
    # mx.fast.rope(x, dims, traditional=True, base=10000, scale=1.0, offset=0):
    # rotates consecutive pairs (x[2i], x[2i+1]) by angle pos * base^(-2i/dims); positions along axis -2.
    # cos/sin tables are precomputed once as plain tensor attributes (not buffers: DDP would broadcast buffers
    # every step; not a dict cache: torch.compile guards on dict contents and recompiles on step 2).
    # Being plain attributes, Module.to() does not move them: Llama.to_device moves them with to_device.
    def __init__(self, dims: int, base: float = 10000.0, max_len: int = 512):
        super().__init__()
        self.dims = dims
        self.base = base
        self.cos, self.sin = self._table(max_len, torch.device("cpu"))

    def _table(self, L, device):
        half = self.dims // 2
        inv_freq = torch.exp(-torch.arange(0, half, dtype=torch.float32) * (math.log(self.base) / half))
        theta = torch.arange(L, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (L, half)
        # computed on the CPU, then moved: the same table values on every device
        return theta.cos().to(device), theta.sin().to(device)

    def to_device(self, device):
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)

    def forward(self, x):
        L = x.shape[-2]
        if L > self.cos.shape[0]:
            self.cos, self.sin = self._table(L, x.device)
        cos, sin = self.cos[:L].to(x.dtype), self.sin[:L].to(x.dtype)
        x1 = x[..., 0::2]
        x2 = x[..., 1::2]
        o1 = x1 * cos - x2 * sin
        o2 = x1 * sin + x2 * cos
        return torch.stack((o1, o2), dim=-1).flatten(-2)


# --sdpa: attention through F.scaled_dot_product_attention(is_causal=True).
SDPA = False


class LlamaAttention(nn.Module):
    def __init__(self, dims: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.rope = RoPE(dims // num_heads)
        self.query_proj = nn.Linear(dims, dims, bias=False)
        self.key_proj = nn.Linear(dims, dims, bias=False)
        self.value_proj = nn.Linear(dims, dims, bias=False)
        self.out_proj = nn.Linear(dims, dims, bias=False)

    def forward(self, queries, keys, values, mask=None):
        queries = self.query_proj(queries)
        keys = self.key_proj(keys)
        values = self.value_proj(values)
        num_heads = self.num_heads
        B, L, D = queries.shape
        queries = queries.reshape(B, L, num_heads, -1).transpose(1, 2)
        keys = keys.reshape(B, L, num_heads, -1).transpose(1, 2)
        values = values.reshape(B, L, num_heads, -1).transpose(1, 2)
        queries = self.rope(queries)
        keys = self.rope(keys)
        scale = math.sqrt(1 / queries.shape[-1])
        if SDPA:
            # Flash attention (causal), as PyTorch users train; the mask is implied.
            values_hat = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale)
            return self.out_proj(values_hat.transpose(1, 2).reshape(B, L, -1))
        scores = (queries * scale) @ keys.transpose(2, 3)
        if mask is not None:
            scores = scores + mask
        scores = torch.softmax(scores, dim=-1)
        values_hat = (scores @ values).transpose(1, 2).reshape(B, L, -1)
        return self.out_proj(values_hat)


class LlamaEncoderLayer(nn.Module):
    def __init__(self, dims: int, mlp_dims: int, num_heads: int):
        super().__init__()
        self.attention = LlamaAttention(dims, num_heads)
        self.norm1 = RMSNorm(dims)
        self.norm2 = RMSNorm(dims)
        self.linear1 = nn.Linear(dims, mlp_dims, bias=False)
        self.linear2 = nn.Linear(dims, mlp_dims, bias=False)
        self.linear3 = nn.Linear(mlp_dims, dims, bias=False)

    def forward(self, x, mask=None):
        y = self.norm1(x)
        y = self.attention(y, y, y, mask)
        x = x + y
        y = self.norm2(x)
        a = self.linear1(y)
        b = self.linear2(y)
        y = a * torch.sigmoid(a) * b  # SwiGLU
        y = self.linear3(y)
        return x + y


class Llama(nn.Module):
    def __init__(self, num_layers, vocab_size, dims, mlp_dims, num_heads):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dims)
        # MLX nn.Embedding init: normal(scale=sqrt(1/dims)); nn.Linear init is U(+-1/sqrt(in)) in both frameworks
        nn.init.normal_(self.embedding.weight, std=math.sqrt(1 / dims))
        self.layers = nn.ModuleList([LlamaEncoderLayer(dims, mlp_dims, num_heads) for _ in range(num_layers)])
        self.norm = RMSNorm(dims)
        self.out_proj = nn.Linear(dims, vocab_size, bias=False)

    def forward(self, x):
        L = x.shape[1]
        dtype = self.embedding.weight.dtype
        # nn.MultiHeadAttention.create_additive_causal_mask: (i < j) * finfo(dtype).min
        idx = torch.arange(L, device=x.device)
        mask = (idx[:, None] < idx[None]).to(dtype) * torch.finfo(dtype).min
        x = self.embedding(x)
        for l in self.layers:
            x = l(x, mask)
        x = self.norm(x)
        return self.out_proj(x)

    def to_device(self, device):
        # parameters through Module.to; the RoPE tables (plain attributes) explicitly. The causal mask is
        # made in forward on the tokens' device.
        self.to(device)
        for m in self.modules():
            if isinstance(m, RoPE):
                m.to_device(device)
        return self


def cpu_times():
    t = os.times()
    return t.user + t.system


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--per-rank-batch", type=int, default=0, help="0 = global_batch / world")
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = leave default)")
    p.add_argument("--compile", action="store_true", help="torch.compile(model) (inductor; Triton on cuda)")
    p.add_argument("--compile-mode", default=None)
    p.add_argument("--sdpa", action="store_true",
                   help="attention as F.scaled_dot_product_attention(is_causal=True) (flash on cuda)")
    p.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) (fused kernel, CPU or CUDA)")
    p.add_argument("--foreach-adamw", action="store_true", help="AdamW(foreach=True) (multi-tensor ops)")
    p.add_argument("--tag", default="")
    p.add_argument("--json", default="")
    p.add_argument("--time-from", type=int, default=3, help="median over steps [time_from, steps] (1-based)")
    p.add_argument("--autocast", choices=["off", "bf16", "f16"], default="off",
                   help="bf16: forward and loss under torch.autocast(device, torch.bfloat16), f32 master weights; "
                        "f16: the same in float16, with a torch.amp.GradScaler (meant for cuda)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: model, data and optimizer state on cuda:(LOCAL_RANK %% device count)")
    p.add_argument("--dist-backend", choices=["gloo", "nccl"], default="gloo",
                   help="torchrun's process group; gloo also for two ranks sharing one GPU (NCCL refuses that)")
    p.add_argument("--tf32", action="store_true",
                   help="cuda only: float32 matmuls in TF32 (default: off, set_float32_matmul_precision('highest'))")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dims", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mlp-dims", type=int, default=512)
    args = p.parse_args()
    global SDPA
    SDPA = args.sdpa
    amp_dtype = {"off": None, "bf16": torch.bfloat16, "f16": torch.float16}[args.autocast]
    use_autocast = amp_dtype is not None
    use_scaler = args.autocast == "f16"
    if args.dims % args.heads or (args.dims // args.heads) % 2:
        p.error("--dims must be a multiple of --heads, with an even head size (RoPE rotates pairs)")
    if args.device == "cpu" and (args.dist_backend == "nccl" or args.tf32):
        p.error("--dist-backend nccl and --tf32 need --device cuda")

    if args.threads:
        torch.set_num_threads(args.threads)

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_train_llama: --device cuda but torch.cuda.is_available() is False")
        # One GPU: every rank on cuda:0 (two processes share it; gloo). Several GPUs: rank r on cuda:r.
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    else:
        dev = torch.device("cpu")
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group(args.dist_backend)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    per_rank = args.per_rank_batch or args.global_batch // world
    global_batch = per_rank * world

    V = 50257
    # identical init on every rank and every device (fixed seed, built on the CPU, then moved; DDP also
    # broadcasts rank 0's parameters)
    torch.manual_seed(args.seed)
    model = Llama(num_layers=args.layers, vocab_size=V, dims=args.dims, mlp_dims=args.mlp_dims,
                  num_heads=args.heads)
    model.to_device(dev)
    nparams = sum(p_.numel() for p_ in model.parameters())
    fwd = model
    if distributed:
        fwd = DDP(model, device_ids=[dev.index]) if cuda else DDP(model)
    if args.compile:
        fwd = torch.compile(fwd, mode=args.compile_mode)
    opt_kw = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if args.fused_adamw:
        opt_kw["fused"] = True
    if args.foreach_adamw:
        opt_kw["foreach"] = True
    optimizer = torch.optim.AdamW(model.parameters(), **opt_kw)
    # --autocast f16: loss scaling (float16's range is too small for the gradients); bf16 needs none
    scaler = torch.amp.GradScaler(dev.type) if use_scaler else None

    # random token ids from a fixed seed; the global batch for step s is data[s],
    # rank r takes rows [r*per_rank, (r+1)*per_rank)
    rng = np.random.RandomState(args.seed)
    data = rng.randint(0, V, size=(args.steps, global_batch, args.block + 1)).astype(np.int64)

    seen_dtypes = {}

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        # --autocast: forward + loss in the autocast region; backward and the optimizer outside it
        with torch.autocast(device_type=dev.type, dtype=amp_dtype or torch.bfloat16, enabled=use_autocast):
            logits = fwd(x)
            loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
        if not seen_dtypes:
            seen_dtypes.update(logits=str(logits.dtype).replace("torch.", ""),
                               loss=str(loss.dtype).replace("torch.", ""))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # unscales; skips the step if a gradient is inf/nan
            scaler.update()
        else:
            loss.backward()  # DDP: gradient all-reduce (average) overlaps with backward
            optimizer.step()
        return loss

    times, losses = [], []
    cpu0, wall0 = None, None
    for s in range(args.steps):
        b = torch.from_numpy(data[s, rank * per_rank:(rank + 1) * per_rank])
        x = b[:, :-1].contiguous().to(dev)
        y = b[:, 1:].contiguous().to(dev)
        sync()  # the copies to the GPU stay out of the step's time
        if s + 1 == args.time_from:
            cpu0, wall0 = cpu_times(), time.perf_counter()
        t0 = time.perf_counter()
        loss = step(x, y)
        lv = loss.item()  # CPU execution is synchronous; .item() for symmetry with mx.eval (cuda: waits for it)
        sync()  # cuda: every queued kernel (and gloo's copies) done before the clock is read
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(lv)
        if rank == 0:
            print(f"[{args.tag}] step {s + 1:3d} loss {lv:.5f} time {dt:.3f}s", flush=True)
    cpu_util = (cpu_times() - cpu0) / (time.perf_counter() - wall0) if cpu0 is not None else float("nan")

    timed = times[args.time_from - 1:]
    med = statistics.median(timed)
    nthreads = len(os.listdir("/proc/self/task"))
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    nan = float("nan")
    cuda_peak = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else nan
    cuda_reserved = torch.cuda.max_memory_reserved(dev) / 2**20 if cuda else nan

    stats = torch.tensor([med, maxrss_kib / 1024, losses[-1], losses[0], times[0], cpu_util, nthreads,
                          torch.get_num_threads(), times[1] if len(times) > 1 else nan, cuda_peak, cuda_reserved],
                         dtype=torch.float64)
    if distributed:
        # NCCL gathers device tensors only; gloo gathers the CPU tensor
        gdev = dev if args.dist_backend == "nccl" else torch.device("cpu")
        allstats = [torch.zeros_like(stats, device=gdev) for _ in range(world)]
        dist.all_gather(allstats, stats.to(gdev))
        allstats = torch.stack(allstats).cpu().numpy()
    else:
        allstats = stats.reshape(1, -1).numpy()

    if rank == 0:
        def num(v):  # NaN (not measured) -> null in the JSON
            return None if math.isnan(v) else float(v)

        tokens_per_step = global_batch * args.block
        med_world = float(allstats[:, 0].max())
        res = dict(
            tag=args.tag, autocast=args.autocast, logits_dtype=seen_dtypes.get("logits"),
            loss_dtype=seen_dtypes.get("loss"),
            param_dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
            world=world, per_rank_batch=per_rank, global_batch=global_batch, block=args.block,
            ddp=distributed, compile=args.compile, compile_mode=args.compile_mode, fused_adamw=args.fused_adamw, foreach_adamw=args.foreach_adamw,
            nparams=int(nparams), steps=args.steps, time_from=args.time_from,
            first_step_s=float(allstats[:, 4].max()), second_step_s=float(allstats[:, 8].max()),
            median_step_s=med_world,
            step_min_s=min(timed), step_max_s=max(timed),
            tokens_per_s=tokens_per_step / med_world,
            loss_step1=float(allstats[:, 3].mean()),
            loss_last=float(allstats[:, 2].mean()),
            losses_rank0=losses,
            per_rank=[dict(rank=i, median_step_s=r[0], maxrss_MiB=r[1], loss_last=r[2], cpu_util=r[5],
                           threads=int(r[6]), torch_threads=int(r[7]), cuda_peak_MiB=num(r[9]),
                           cuda_peak_reserved_MiB=num(r[10])) for i, r in enumerate(allstats)],
            torch=torch.__version__,
            omp_num_threads=os.environ.get("OMP_NUM_THREADS", ""),
            device=str(dev), gpu_name=torch.cuda.get_device_name(dev) if cuda else None,
            cuda=torch.version.cuda if cuda else None,
            dist_backend=args.dist_backend if distributed else None,
            layers=args.layers, dims=args.dims, heads=args.heads, mlp_dims=args.mlp_dims, vocab=V,
            tf32=args.tf32, float32_matmul_precision=torch.get_float32_matmul_precision() if cuda else None,
            grad_scaler=use_scaler, grad_scale_last=float(scaler.get_scale()) if use_scaler else None,
            # the largest single rank's peak; with world 2 on one GPU the card holds the sum of the ranks'
            cuda_peak_MiB=num(allstats[:, 9].max()) if cuda else None,
            cuda_peak_reserved_MiB=num(allstats[:, 10].max()) if cuda else None,
        )
        where = ""
        if cuda:
            where = (f"{res['gpu_name']} ({dev}), peak allocated {res['cuda_peak_MiB']:.0f} MiB "
                     f"(reserved {res['cuda_peak_reserved_MiB']:.0f}) per rank (max), ")
        print(f"summary: autocast {args.autocast} (logits {res['logits_dtype']}, loss {res['loss_dtype']}, "
              f"params/AdamW {res['param_dtype']}), world {world}, "
              f"{f'DDP {args.dist_backend}, ' if distributed else ''}{where}"
              f"{torch.get_num_threads()} thread(s)/rank, median {med_world:.3f} s/step over steps "
              f"{args.time_from}-{args.steps}, {res['tokens_per_s']:.0f} tokens/s, peak RSS "
              f"{max(r['maxrss_MiB'] for r in res['per_rank']):.0f} MiB per rank (max)", flush=True)
        print("RESULT " + json.dumps(res), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
