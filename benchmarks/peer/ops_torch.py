"""The peer of bench_ops: the same operations in PyTorch on the same threads, one line per case,
"name seconds" (the median of 5 repetitions of at least 50 ms, as bench_ops times its own)."""
import argparse
import statistics
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, required=True)
parser.add_argument("--shape", required=True)
args = parser.parse_args()
torch.set_num_threads(args.threads)
n, c, h, w = (int(v) for v in args.shape.split(","))
gen = torch.Generator().manual_seed(1)
x = torch.rand(n, c, h, w, generator=gen) * 2 - 1
per_channel = torch.rand(c, 1, 1, generator=gen)
mask = torch.rand(n, 1, h, w, generator=gen)


def seconds_per_call(fn):
    iters = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        s = time.perf_counter() - t0
        if s >= 0.05:
            break
        iters = min(iters * 100, max(iters + 1, int(iters * 0.05 / max(s, 1e-9) * 1.2)))
    reps = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        reps.append((time.perf_counter() - t0) / iters)
    return statistics.median(reps)


cases = {
    "sum_hw_keepdim": lambda: x.sum(dim=(2, 3), keepdim=True),
    "sum_n": lambda: x.sum(dim=0),
    "mean_all": lambda: x.mean(),
    "max_hw": lambda: x.amax(dim=(2, 3)),
    "sum_to_c11": lambda: x.sum(dim=(0, 2, 3)).view(c, 1, 1),
    "add_c11": lambda: x + per_channel,
    "mul_n1hw": lambda: x * mask,
    "softplus": lambda: torch.nn.functional.softplus(x),
    "sigmoid": lambda: torch.sigmoid(x),
    "exp": lambda: torch.exp(x),
    "permute_nhwc": lambda: x.permute(0, 2, 3, 1).contiguous(),
}
with torch.no_grad():
    for name, fn in cases.items():
        print(name, seconds_per_call(fn), flush=True)

# Layers between convolutions, forward and backward (as bench_ops: an affine instance norm then a
# ReLU, and a leaky ReLU), with autograd.
norm = torch.nn.InstanceNorm2d(c, affine=True)
xg = x.clone().requires_grad_(True)
dy = torch.rand(n, c, h, w, generator=gen) * 2 - 1


def norm_relu():
    torch.relu(norm(xg)).backward(dy)


def leaky():
    torch.nn.functional.leaky_relu(xg, 0.2).backward(dy)


for name, fn in {"instance_norm_relu_fwd_bwd": norm_relu, "leaky_relu_fwd_bwd": leaky}.items():
    print(name, seconds_per_call(fn), flush=True)
