"""PyTorch's side of mlx-array/examples/gpu_bench.rs: matmul TFLOP/s, memory bandwidth GB/s and one
forward+backward of a Llama-like block, on one GPU (or the CPU, to test the script).

  python3 bench/torch_gpu_ops.py                       # CUDA, full sizes, every dtype
  python3 bench/torch_gpu_ops.py --dtypes f32,bf16     # a subset of f32, tf32, f16, bf16
  python3 bench/torch_gpu_ops.py --device cpu --small --dtypes f32,bf16   # a quick test anywhere
  ... --json out.json                                  # also write the RESULT object to a file
  ... --only matmul,memory,block                       # which parts (default all three)

Output: one human line per measurement, then one line `RESULT {json}` holding
  {"device", "gpu_name", "capability", "sm_count", "gpu_total_MiB", "torch", "cuda", "cudnn", "small",
   "repeats", "min_time_s", "warmup", "fp16_reduced_precision_reduction", "bf16_reduced_precision_reduction",
   "results": [record, ...]}
with records of three kinds (names as in gpu_bench.rs, so the two can be joined on kind + name + dtype):
  matmul  {kind, name, dtype, tf32, shape: [m, k, n], m, k, n, ta, tb, seconds, tflops, iters}
  memory  {kind, name, dtype, shape, elements, bytes, seconds, gbs, iters}
  block   {kind, name, dtype, tf32, t, d, seconds, iters}
`seconds` is per call: the median over --repeats repeats of (time of `iters` back-to-back calls) / iters,
after --warmup calls; `iters` is chosen so that one repeat takes at least --min-time seconds. On CUDA a
repeat is timed with CUDA events recorded around the calls (the CPU only queues them); on the CPU with
time.perf_counter.

Matmul: 1024^3, 4096^3, 8192^3 and the reference Llama's shapes (2044 = 4 x 511 tokens, dims 256, MLP 512,
vocab 50257): the forward logits, mlp, and their weight (dW, `aT`) and input (dX, `bT`) gradients. A
transposed operand is stored transposed ([k, m] for a, [n, k] for b) and read through `.t()`, as the Rust
bench does. TFLOP/s = 2 m k n / seconds / 1e12. Operands are uniform in [-1, 1).
dtypes:  f32   float32 with TF32 off: torch.backends.cuda.matmul.allow_tf32 = False,
               torch.backends.cudnn.allow_tf32 = False, torch.set_float32_matmul_precision("highest")
               (IEEE float32 products; the fair comparison with an f32 kernel)
         tf32  float32 operands with TF32 on (allow_tf32 = True, precision "high"): informative only,
               TF32 rounds the operands to 10 mantissa bits
         f16, bf16   half-precision operands and result (cuBLAS accumulates in float32)
TF32 is switched back off after every tf32 row.

Memory (f32 by default, --mem-dtype to change; 64 Mi elements = 256 MiB of f32, 1 Mi with --small; an
[elements / 4096, 4096] array x, and y of the same shape). GB/s = bytes / seconds / 1e9, where bytes
counts every element read once and written once, as gpu_bench.rs counts them (E = elements x element size):
  copy          dst.copy_(x)                 2 E  (read x, write dst)
  scale x*2     torch.mul(x, 2, out=o)       2 E
  heads copy    o.view(64, R, 64).copy_(x.view(R, 64, 64).transpose(0, 1))   2 E  (the attention heads' gather)
  add x+y       torch.add(x, y, out=o)       3 E  (read x and y, write o)
  exp           torch.exp(x, out=o)          2 E
  row sum       torch.sum(x, -1, out=o)      1 E  (the input only; the [rows] result is not counted)
  row softmax   torch.softmax(x, -1)         2 E  (input and output; the kernel's internal passes are not)
Outputs are preallocated (out=) except softmax's, which the caching allocator serves without a cudaMalloc.

Block: gpu_bench.rs's Llama-like block (RMS norm without weight, 4-head attention without a mask, SiLU
MLP of 2D, residuals, loss = mean(x2^2)), T = 511, D = 256 (/4 with --small), forward and backward for
the gradients of the six weights, all tensors in the row's dtype (no autocast).

--small divides every dimension by 4 and skips products with m k n > 2^30 (the 8192^3 cube), as the
Rust bench's --small does.
"""
import argparse
import json
import math
import statistics
import time

import torch

# (name, m, k, n, transpose a, transpose b): gpu_bench.rs's SHAPES, in its order.
SHAPES = [
    ("1024^3", 1024, 1024, 1024, False, False),
    ("4096^3", 4096, 4096, 4096, False, False),
    ("8192^3", 8192, 8192, 8192, False, False),
    ("logits 2044x256@256x50257", 2044, 256, 50257, False, False),
    ("dW 256x2044@2044x50257 (aT)", 256, 2044, 50257, True, False),
    ("dX 2044x50257@50257x256 (bT)", 2044, 50257, 256, False, True),
    ("mlp 2044x256@256x512", 2044, 256, 512, False, False),
    ("dW 256x2044@2044x512 (aT)", 256, 2044, 512, True, False),
    ("dX 2044x512@512x256 (bT)", 2044, 512, 256, False, True),
]

DTYPES = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def set_tf32(on: bool):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


class Timer:
    """Seconds per call of fn: median over `repeats` of (time of `iters` calls) / iters."""

    def __init__(self, device, warmup, repeats, min_time, max_iters):
        self.device, self.warmup, self.repeats = device, warmup, repeats
        self.min_time, self.max_iters = min_time, max_iters
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _run(self, fn, iters):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3  # elapsed_time is in ms
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return time.perf_counter() - t0

    def __call__(self, fn):
        for _ in range(self.warmup):
            fn()
        self.sync()
        one = self._run(fn, 1)
        iters = max(1, min(self.max_iters, math.ceil(self.min_time / max(one, 1e-9))))
        samples = [self._run(fn, iters) / iters for _ in range(self.repeats)]
        return statistics.median(samples), iters


def uniform(shape, dtype, device, gen, scale=1.0):
    # made in float32 on the CPU from a seeded generator, then cast and moved once
    x = (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1) * scale
    return x.to(device=device, dtype=dtype)


def bench_matmul(args, timer, device, results):
    div = 4 if args.small else 1
    gen = torch.Generator().manual_seed(1)
    for label in args.dtypes:
        dtype = DTYPES[label]
        set_tf32(label == "tf32")
        try:
            for name, m, k, n, ta, tb in SHAPES:
                m, k, n = m // div, k // div, n // div
                if args.small and m * k * n > 1 << 30:
                    print(f"matmul {label} {name} ({m}x{k}x{n}): skipped: --small", flush=True)
                    continue
                a = uniform((k, m) if ta else (m, k), dtype, device, gen)
                b = uniform((n, k) if tb else (k, n), dtype, device, gen)
                av = a.t() if ta else a
                bv = b.t() if tb else b
                s, iters = timer(lambda: torch.matmul(av, bv))
                tflops = 2 * m * k * n / s / 1e12
                print(f"matmul {label} {name} ({m}x{k}x{n}): {tflops:.4g} TFLOP/s ({s * 1e3:.3f} ms, "
                      f"{iters} iters)", flush=True)
                results.append(dict(kind="matmul", name=name, dtype=label, tf32=label == "tf32",
                                    shape=[m, k, n], m=m, k=k, n=n, ta=ta, tb=tb, seconds=s, tflops=tflops,
                                    iters=iters))
                del a, b, av, bv
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            set_tf32(False)


def bench_memory(args, timer, device, results):
    dtype = DTYPES[args.mem_dtype]
    elements = args.mem_elements or (1 << 20 if args.small else 1 << 26)
    cols = min(4096, elements)
    rows = elements // cols
    elements = rows * cols
    gen = torch.Generator().manual_seed(20)
    x = uniform((rows, cols), dtype, device, gen)
    y = uniform((rows, cols), dtype, device, gen)
    o = torch.empty_like(x)
    r = torch.empty(rows, dtype=dtype, device=device)
    E = elements * x.element_size()
    kernels = [
        ("copy", 2 * E, lambda: o.copy_(x)),
        ("scale x*2", 2 * E, lambda: torch.mul(x, 2, out=o)),
        ("heads copy", 2 * E, lambda: o.view(64, rows, 64).copy_(x.view(rows, 64, 64).transpose(0, 1))),
        ("add x+y", 3 * E, lambda: torch.add(x, y, out=o)),
        ("exp", 2 * E, lambda: torch.exp(x, out=o)),
        ("row sum", E, lambda: torch.sum(x, -1, out=r)),
        ("row softmax", 2 * E, lambda: torch.softmax(x, -1)),
    ]
    for name, nbytes, fn in kernels:
        s, iters = timer(fn)
        gbs = nbytes / s / 1e9
        print(f"{name} {args.mem_dtype} ([{rows}, {cols}], {E / 2**20:.0f} MiB): {gbs:.4g} GB/s "
              f"({s * 1e3:.3f} ms, {iters} iters)", flush=True)
        results.append(dict(kind="memory", name=name, dtype=args.mem_dtype, shape=[rows, cols], elements=elements,
                            bytes=nbytes, seconds=s, gbs=gbs, iters=iters))


def block_loss(x, wq, wk, wv, wo, w1, w2, heads=4):
    # gpu_bench.rs's `block`, op for op
    t, d = x.shape
    hd = d // heads

    def norm(v):
        return v * torch.rsqrt(v.square().mean(-1, keepdim=True) + 1e-5)

    h = norm(x)

    def split(w):
        return (h @ w).reshape(t, heads, hd).transpose(0, 1)

    q, k, v = split(wq), split(wk), split(wv)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
    att = torch.softmax(scores, -1) @ v
    att = att.transpose(0, 1).reshape(t, d)
    x1 = x + att @ wo
    u = norm(x1) @ w1
    x2 = x1 + (u * torch.sigmoid(u)) @ w2
    return x2.square().mean()


def bench_block(args, timer, device, results):
    div = 4 if args.small else 1
    t, d = 511 // div, 256 // div
    for label in args.dtypes:
        dtype = DTYPES[label]
        set_tf32(label == "tf32")
        try:
            gen = torch.Generator().manual_seed(10)
            x = uniform((t, d), dtype, device, gen)
            ws = [uniform(shape, dtype, device, gen, scale=math.sqrt(1 / d)).requires_grad_()
                  for shape in [(d, d), (d, d), (d, d), (d, d), (d, 2 * d), (2 * d, d)]]

            def step():
                loss = block_loss(x, *ws)
                return torch.autograd.grad(loss, ws)

            s, iters = timer(step)
            print(f"llama-like block {label} fwd+bwd (T={t}, D={d}, 4 heads, MLP 2D): {s * 1e3:.3f} ms/step "
                  f"({iters} iters)", flush=True)
            results.append(dict(kind="block", name="llama-like block fwd+bwd", dtype=label, tf32=label == "tf32",
                                t=t, d=d, seconds=s, iters=iters))
        finally:
            set_tf32(False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--small", action="store_true", help="every dimension / 4; skip m k n > 2^30")
    p.add_argument("--dtypes", default="f32,tf32,f16,bf16", help="matmul and block dtypes, of f32,tf32,f16,bf16")
    p.add_argument("--mem-dtype", default="f32", choices=["f32", "f16", "bf16"])
    p.add_argument("--mem-elements", type=int, default=0, help="0: 2^26 (256 MiB of f32), 2^20 with --small")
    p.add_argument("--only", default="matmul,memory,block", help="which parts to run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.1, help="seconds per repeat, at least (sets iters)")
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (CPU; 0 = leave default)")
    p.add_argument("--json", default="", help="also write the RESULT object here")
    args = p.parse_args()
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for d in args.dtypes:
        if d not in DTYPES:
            p.error(f"--dtypes: unknown dtype {d!r} (f32, tf32, f16, bf16)")
    parts = set(args.only.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    info = dict(device=str(device), gpu_name=None, capability=None, sm_count=None, gpu_total_MiB=None,
                torch=torch.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                small=args.small, repeats=args.repeats, min_time_s=args.min_time, warmup=args.warmup,
                # cuBLAS may reduce f16/bf16 products in reduced precision (PyTorch's defaults, left as they are)
                fp16_reduced_precision_reduction=torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
                bf16_reduced_precision_reduction=torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_gpu_ops: --device cuda but torch.cuda.is_available() is False")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        props = torch.cuda.get_device_properties(device)
        info.update(device=str(device), gpu_name=torch.cuda.get_device_name(device),
                    capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                    gpu_total_MiB=props.total_memory / 2**20)
        print(f"GPU: {info['gpu_name']} (sm {info['capability']}, {props.multi_processor_count} SMs, "
              f"{info['gpu_total_MiB']:.0f} MiB)", flush=True)
    else:
        print(f"device: {device} ({torch.get_num_threads()} threads)", flush=True)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {info['cudnn']}; "
          f"{'sizes / 4; ' if args.small else ''}median of {args.repeats} repeats of >= {args.min_time} s",
          flush=True)

    set_tf32(False)
    timer = Timer(device, args.warmup, args.repeats, args.min_time, args.max_iters)
    results = []
    if "matmul" in parts:
        with torch.no_grad():
            bench_matmul(args, timer, device, results)
    if "memory" in parts:
        with torch.no_grad():
            bench_memory(args, timer, device, results)
    if "block" in parts:
        bench_block(args, timer, device, results)
    info["results"] = results
    print("RESULT " + json.dumps(info), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
