#!/usr/bin/env python3
# Chapter 03 — PyTorch's half of bench_ch03_norms: BatchNorm (in training)
# and LayerNorm forward on the same shapes with fp16 input and output,
# through PyTorch on one CPU thread, timed as the C++ benchmark times its
# own (CPU time per call, the fastest of the repetitions). The C++ benchmark
# runs this script with the Python it is given (--python=PATH or
# MPT_TORCH_PYTHON) and prints the ratio.
# Depends on: bench_torch_support.py, Python 3 and, optionally, torch (never
# a dependency of the project: without it the script prints "PyTorch not
# importable" and exits 0).
#
#   bench_ch03_norms_torch.py [--bn=N,C,H,W[:...]] [--ln=R,D[:...]]
#                             [--repetitions=5] [--min-time=0.5]
#
# What runs is what a PyTorch user runs for an fp16 norm on the CPU: the
# module converted with .half() (γ, β and BatchNorm's running estimates in
# fp16 too; PyTorch's CPU kernels accumulate the statistics in FP32) on an
# fp16 input, x ~ N(1, 1). Autocast would change nothing here: on the CPU
# batch_norm and layer_norm are on none of its lists and run in the input's
# dtype. The modules' parameters require gradients, as in a training step,
# so autograd records the call; no backward runs (the C++ side times none).
# The C++ side starts this script with glibc keeping freed blocks
# (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), as its own process does.
#
# Output, one result per line, for the C++ side to parse:
#   torch <version> <cpu capability>
#   forward_ms bn/<N>x<C>x<H>x<W> <fastest ms per call>
#   forward_ms ln/<R>x<D> <fastest ms per call>
import sys

from bench_torch_support import arg, fastest_ms, import_torch


def shapes(text):
    """'64,64,32,32:256,64,32,32' into lists of sizes."""
    return [[int(s) for s in one.split(",")] for one in text.split(":") if one]


def main():
    bn_shapes = shapes(arg("bn", "64,64,32,32:256,64,32,32"))
    ln_shapes = shapes(arg("ln", "4096,1024:16384,1024"))
    repetitions = int(arg("repetitions", "5"))
    min_time = float(arg("min-time", "0.5"))
    torch = import_torch()
    if torch is None:
        return 0
    torch.manual_seed(7)

    def time_forward(key, module, shape):
        module = module.half().train()
        x = (torch.randn(*shape) + 1.0).half()
        ms = fastest_ms(lambda: module(x), repetitions, min_time)
        print(f"forward_ms {key} {ms:.6f}", flush=True)

    batch_norms = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    for s in bn_shapes:
        time_forward("bn/" + "x".join(map(str, s)), batch_norms[len(s)](s[1], eps=1e-5), s)
    for s in ln_shapes:
        time_forward("ln/" + "x".join(map(str, s)), torch.nn.LayerNorm(s[-1], eps=1e-5), s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
