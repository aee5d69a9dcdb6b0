"""PyTorch's attention forward and forward+backward on one CUDA GPU at the shapes the GPU issue names
([4, 4, 512, 64] and [16, 12, 512, 64], causal): F.scaled_dot_product_attention (flash) and the naive
matmul-softmax-matmul, in f32 (TF32 off), f16 and bf16. CUDA events, median of 20 calls after 5 warm-ups.
Ours: `gpu_bench --only attention --dtype f32|f16` (with MLX_PROFILE=1 for the kernels' GPU time).

  python3 bench/torch_attention.py
"""
import math
import statistics

import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False


def timeit(fn, n=20):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def naive(q, k, v):
    L = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.triu(torch.ones(L, L, dtype=torch.bool, device=q.device), 1), float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    for shape in [(4, 4, 512, 64), (16, 12, 512, 64)]:
        for dt in [torch.float32, torch.float16, torch.bfloat16]:
            q, k, v = (torch.randn(shape, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
            g = torch.randn(shape, device="cuda", dtype=dt)
            for name, f in [
                ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                ("naive", lambda: naive(q, k, v)),
            ]:
                fwd = timeit(f)

                def both():
                    f().backward(g)
                    q.grad = k.grad = v.grad = None

                fb = timeit(both)
                print(f"RESULT attention {name} {list(shape)} {str(dt)[6:]}: "
                      f"forward {fwd:.3f} ms, forward+backward {fb:.3f} ms")


if __name__ == "__main__":
    main()
