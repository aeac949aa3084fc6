"""The peer of bench_penalty: the same PatchGAN discriminator and the same three steps in PyTorch on
the same threads, one line per figure, "name value": the three steps in turns, --cycles times
after one untimed cycle, as bench_penalty runs its own; per step "name" the median wall-clock
seconds, "name_min" the fastest, "name_cpu" the median CPU seconds, "name_cpu_min" the fewest, and for (b) and (c)
"name_ratio" and "name_ratio_cpu" the medians of each cycle's ratio to (a):
  a  without penalty: D(real), D(fake), mean softplus(-D(real)) + mean softplus(D(fake)), backward
  b  with R1 as nn::r1_penalty computes it: a third forward of D on the real batch (a new leaf that
     requires grad), g = autograd.grad(D(x).sum(), x, create_graph=True), 10 / 2 * mean_i ||g_i||^2
     added to the loss, one backward
  c  with R1 sharing the real forward (real.requires_grad_(), the usual PyTorch form)
  b_forward, b_penalty, b_backward: (b) by phase, the medians of as many steps
  parameters: D's parameter count, which must equal ours"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, required=True)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--size", type=int, default=64)
parser.add_argument("--cycles", type=int, default=15)
args = parser.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)


class PatchDiscriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 64, 4, 2, 1)
        self.c2 = nn.Conv2d(64, 128, 4, 2, 1)
        self.n2 = nn.InstanceNorm2d(128, affine=True)
        self.c3 = nn.Conv2d(128, 256, 4, 2, 1)
        self.n3 = nn.InstanceNorm2d(256, affine=True)
        self.c4 = nn.Conv2d(256, 1, 4, 1, 1)

    def forward(self, x):
        h = F.leaky_relu(self.c1(x), 0.2)
        h = F.leaky_relu(self.n2(self.c2(h)), 0.2)
        h = F.leaky_relu(self.n3(self.c3(h)), 0.2)
        return self.c4(h)


d = PatchDiscriminator()
gen = torch.Generator().manual_seed(1)
real = torch.rand(args.batch, 3, args.size, args.size, generator=gen) * 2 - 1
fake = torch.rand(args.batch, 3, args.size, args.size, generator=gen) * 2 - 1
weight = 10.0


def gan_loss(sr, sf):
    return F.softplus(-sr).mean() + F.softplus(sf).mean()


def r1(x):
    x = x.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(d(x).sum(), x, create_graph=True)
    return weight / 2 * g.square().sum(dim=(1, 2, 3)).mean()


def step_a():
    d.zero_grad()
    gan_loss(d(real), d(fake)).backward()


def step_b(phases=None):
    t0 = time.perf_counter()
    d.zero_grad()
    loss = gan_loss(d(real), d(fake))
    t1 = time.perf_counter()
    loss = loss + r1(real)
    t2 = time.perf_counter()
    loss.backward()
    if phases is not None:
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))


def step_c():
    d.zero_grad()
    x = real.detach().requires_grad_(True)
    sr = d(x)
    (g,) = torch.autograd.grad(sr.sum(), x, create_graph=True)
    penalty = weight / 2 * g.square().sum(dim=(1, 2, 3)).mean()
    (gan_loss(sr, d(fake)) + penalty).backward()


def cycles():
    """The three steps in turns, one untimed cycle then --cycles timed: per step the wall clock and the
    process's CPU time (every thread's), as bench_penalty takes its own."""
    wall, cpu, phases = ([], [], []), ([], [], []), []
    for cycle in range(args.cycles + 1):
        for v, fn in enumerate((step_a, step_b, step_c)):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(phases) if v == 1 and cycle > 0 else fn()
            w, c = time.perf_counter() - t0, time.process_time() - c0
            if cycle > 0:
                wall[v].append(w)
                cpu[v].append(c)
    return wall, cpu, phases


print("parameters", sum(p.numel() for p in d.parameters()), flush=True)
wall, cpu, phases = cycles()
for v, name in enumerate(("a", "b", "c")):
    print(name, statistics.median(wall[v]))
    print(name + "_min", min(wall[v]))
    print(name + "_cpu", statistics.median(cpu[v]))
    print(name + "_cpu_min", min(cpu[v]))
    if v > 0:
        print(name + "_ratio", statistics.median(x / y for x, y in zip(wall[v], wall[0])))
        print(name + "_ratio_cpu", statistics.median(x / y for x, y in zip(cpu[v], cpu[0])))
for k, name in enumerate(("b_forward", "b_penalty", "b_backward")):
    print(name, statistics.median(p[k] for p in phases), flush=True)
