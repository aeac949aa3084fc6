#!/usr/bin/env python3
"""The Python side of the interop tests (tests/interop/python_test.cpp).

  torch-load GEN IO C F B     the generator of the PyTorch port (benchmarks/peer) with C image
                              channels, F filters and B residual blocks loads GEN (written by
                              nn::save_safetensors) with load_state_dict(strict=True) and maps IO's
                              "input" to IO's "output" within 1e-5
  torch-save DIR C F B SEED   a randomly initialised port generator writes DIR/gen.safetensors
                              (safetensors.torch.save_file of its state_dict) and DIR/io.safetensors
                              (an input and its output) for the C++ side to compare with
  torch-layer DIR KIND ARGS.. the PyTorch layer KIND (embedding, upsample_nearest, upsample_bilinear,
                              pixel_shuffle, layer_norm, spectral_linear, spectral_conv2d) with
                              ARGS loads DIR/state.safetensors (written by nn::save_safetensors
                              before our forward), runs forward and backward in training mode on
                              DIR/io.safetensors's "input" and "dy", and compares "output", "dx",
                              every "grad.<parameter>" and every "after.<buffer>" within 1e-5
                              of the larger of 1 and the tensor's largest magnitude
  torch-penalty DIR           the discriminator of python_test.cpp's penalty case (a torch.nn.Module
                              with its member names, spectral norm in eval mode: the stored u and v)
                              loads DIR/state.safetensors, and R1 (10/2 * mean_i ||g_i||^2) at
                              DIR/io.safetensors's "input" and WGAN-GP (10 * mean_i (||g_i|| - 1)^2)
                              at its "points", g = autograd.grad(D(x).sum(), x, create_graph=True),
                              each followed by backward, give its "r1" and "gp" and every
                              "r1.grad.<parameter>" and "gp.grad.<parameter>" within 1e-5 of the
                              larger of 1 and the tensor's largest magnitude
  onnx MODEL IO [TOL]         onnx.checker (full check) passes MODEL, and onnxruntime maps IO's
                              "input" to IO's "output" within TOL (default 1e-5)

Prints one line "max_abs_diff X" and exits 1 when the difference is over the tolerance.
"""

import os
import sys

import numpy as np

TOLERANCE = 1e-5


def port():
    sys.path.insert(0, os.environ["DISTRIBUTE_TORCH_PORT"])
    import cyclegan_torch  # noqa: E402
    return cyclegan_torch


def report(diff, tolerance=TOLERANCE):
    print(f"max_abs_diff {diff:.3g} (tolerance {tolerance:.3g})")
    return 0 if diff <= tolerance else 1


def torch_load(gen, io, c, f, b):
    import torch
    from safetensors.numpy import load_file
    from safetensors.torch import load_file as load_torch
    model = port().make_generator(int(c), int(f), int(b))
    model.load_state_dict(load_torch(gen), strict=True)
    model.eval()
    t = load_file(io)
    with torch.no_grad():
        y = model(torch.from_numpy(t["input"])).numpy()
    return report(float(np.max(np.abs(y - t["output"]))))


def torch_save(out, c, f, b, seed):
    import torch
    from safetensors.torch import save_file
    cg = port()
    model = cg.make_generator(int(c), int(f), int(b))
    gen = torch.Generator().manual_seed(int(seed))
    cg.init_weights(model, gen)
    with torch.no_grad():  # a bias that is not zero, so that loading it is tested too
        model[-2].bias.normal_(0.0, 0.1, generator=gen)
    model.eval()
    x = torch.rand(2, int(c), 28, 28, generator=gen) * 2 - 1
    with torch.no_grad():
        y = model(x)
    save_file(model.state_dict(), os.path.join(out, "gen.safetensors"))
    save_file({"input": x.contiguous(), "output": y.contiguous()}, os.path.join(out, "io.safetensors"))
    return 0


def torch_layer_module(kind, args):
    import torch
    a = [int(v) for v in args]
    if kind == "embedding":
        return torch.nn.Embedding(a[0], a[1])
    if kind in ("upsample_nearest", "upsample_bilinear"):
        return torch.nn.Upsample(scale_factor=a[0], mode=kind.split("_")[1])
    if kind == "pixel_shuffle":
        return torch.nn.PixelShuffle(a[0])
    if kind == "layer_norm":
        return torch.nn.LayerNorm(a)
    if kind == "spectral_linear":
        return torch.nn.utils.spectral_norm(torch.nn.Linear(a[0], a[1]))
    if kind == "spectral_conv2d":
        return torch.nn.utils.spectral_norm(torch.nn.Conv2d(a[0], a[1], a[2], padding=a[3]))
    sys.exit(f"unknown layer {kind}")


def torch_layer(directory, kind, *args):
    import torch
    from safetensors.torch import load_file
    module = torch_layer_module(kind, args)
    state = load_file(os.path.join(directory, "state.safetensors"))
    if state:
        module.load_state_dict(state, strict=True)
    module.train()
    t = load_file(os.path.join(directory, "io.safetensors"))
    x = t["input"]
    if kind == "embedding":
        x = x.long()
    else:
        x = x.clone().requires_grad_(True)
    y = module(x)
    y.backward(t["dy"])
    pairs = {"output": (t["output"], y.detach())}
    if "dx" in t:
        pairs["dx"] = (t["dx"], x.grad)
    parameters = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    for name, value in t.items():
        if name.startswith("grad."):
            pairs[name] = (value, parameters[name[5:]].grad)
        elif name.startswith("after."):
            pairs[name] = (value, buffers[name[6:]])
    return compare(pairs)


def compare(pairs):
    """(ours, PyTorch's) per name: the largest difference relative to the larger of 1 and PyTorch's
    largest magnitude (a weight gradient sums many products, rounded in another order by each
    library)."""
    worst = 0.0
    for name, (ours, theirs) in pairs.items():
        if ours.numel() == 0:
            continue
        scale = max(1.0, float(theirs.abs().max()))
        d = float((ours - theirs).abs().max()) / scale
        print(f"{name}: {d:.3g} (of {scale:.3g}; largest {float(theirs.abs().max()):.3g})")
        worst = max(worst, d)
    return report(worst)


def torch_penalty(directory):
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    sn = torch.nn.utils.spectral_norm

    class Discriminator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect")
            self.c2 = sn(torch.nn.Conv2d(4, 4, 3, stride=2, padding=1))
            self.dense = torch.nn.Linear(16, 8)
            self.embed = torch.nn.Embedding(3, 8)
            self.out = sn(torch.nn.Linear(8, 1))

        def forward(self, x, labels):
            h = F.leaky_relu(self.c1(x), 0.2)
            h = torch.flatten(F.avg_pool2d(self.c2(h), 2), 1)
            h = F.leaky_relu(self.dense(h), 0.2)
            return self.out(h) + (self.embed(labels) * h).sum(1, keepdim=True)

    d = Discriminator()
    d.load_state_dict(load_file(os.path.join(directory, "state.safetensors")), strict=True)
    d.eval()  # spectral norm: sigma from the stored u and v, no power iteration
    t = load_file(os.path.join(directory, "io.safetensors"))
    labels = t["labels"].long()

    def input_gradient(x):
        x = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(d(x, labels).sum(), x, create_graph=True)
        return g.flatten(1)

    penalties = {
        "r1": lambda: 10.0 / 2 * input_gradient(t["input"]).pow(2).sum(1).mean(),
        "gp": lambda: 10.0 * (input_gradient(t["points"]).norm(2, dim=1) - 1).pow(2).mean(),
    }
    parameters = dict(d.named_parameters())
    pairs = {}
    for which, penalty in penalties.items():
        d.zero_grad(set_to_none=True)
        p = penalty()
        p.backward()
        pairs[which] = (t[which], p.detach())
        prefix = which + ".grad."
        names = [n[len(prefix):] for n in t if n.startswith(prefix)]
        if sorted(names) != sorted(parameters):
            sys.exit(f"{which}: gradients of {sorted(names)}, but the parameters are {sorted(parameters)}")
        for name in names:
            # None: the penalty does not depend on the parameter (a bias before piecewise-linear
            # activations only: dD/dx does not involve it); ours is then zero
            grad = parameters[name].grad
            pairs[prefix + name] = (t[prefix + name], torch.zeros_like(parameters[name]) if grad is None else grad)
    return compare(pairs)


def run_onnx(model, io, tolerance=TOLERANCE):
    import onnx
    import onnxruntime as ort
    from safetensors.numpy import load_file
    onnx.checker.check_model(model, full_check=True)
    t = load_file(io)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    (y,) = session.run(["output"], {"input": t["input"]})
    return report(float(np.max(np.abs(y - t["output"]))), float(tolerance))


def main():
    what, args = sys.argv[1], sys.argv[2:]
    if what == "torch-load":
        return torch_load(*args)
    if what == "torch-save":
        return torch_save(*args)
    if what == "torch-layer":
        return torch_layer(*args)
    if what == "torch-penalty":
        return torch_penalty(*args)
    if what == "onnx":
        return run_onnx(*args)
    sys.exit(f"unknown check {what}")


if __name__ == "__main__":
    sys.exit(main())
