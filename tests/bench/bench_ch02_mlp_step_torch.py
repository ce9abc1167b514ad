#!/usr/bin/env python3
# Chapter 02 — PyTorch's half of bench_ch02_mlp_step: the same FP32 MLP
# training step and the same GEMMs through PyTorch on one CPU thread, timed
# as the C++ benchmark times its own (CPU time per step, the fastest of the
# repetitions). The C++ benchmark runs this script with the Python it is
# given (--python=PATH or MPT_TORCH_PYTHON) and prints the ratio.
# Depends on: bench_torch_support.py, Python 3 and, optionally, torch (never
# a dependency of the project: without it the script prints "PyTorch not
# importable" and exits 0).
#
#   bench_ch02_mlp_step_torch.py [--batch=128] [--sizes=256,512,512,10]
#                                [--repetitions=5] [--min-time=0.5]
#
# Output, one result per line, for the C++ side to parse:
#   torch <version> <cpu capability>
#   step_ms <fastest ms per step>
#   gemm_ms <M>x<N>x<K> <op> <fastest ms per call>
import sys

from bench_torch_support import arg, fastest_ms, import_torch


def main():
    batch = int(arg("batch", "128"))
    sizes = [int(s) for s in arg("sizes", "256,512,512,10").split(",")]
    repetitions = int(arg("repetitions", "5"))
    min_time = float(arg("min-time", "0.5"))
    torch = import_torch()
    if torch is None:
        return 0
    import torch.nn.functional as F

    torch.manual_seed(7)

    # The library's Mlp: Linear (with bias), ReLU between the layers, none
    # after the last; SGD lr 0.01, momentum 0.9; mean cross-entropy.
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, sizes[0])
    y = torch.randint(0, sizes[-1], (batch,))

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    print(f"step_ms {fastest_ms(step, repetitions, min_time):.6f}")

    # The step's GEMMs one by one, as bench_ch02_mlp_step's gemm/ runs
    # (forward x·Wᵀ, dW = dyᵀ·x, and dx = dy·W except for the first layer,
    # whose input is data), through torch.mm into a preallocated output.
    for i in range(len(sizes) - 1):
        k, n = sizes[i], sizes[i + 1]
        a = torch.randn(batch, k)
        w = torch.randn(n, k)
        dy = torch.randn(batch, n)
        out = torch.empty(batch, n)
        print(f"gemm_ms {batch}x{n}x{k} NT {fastest_ms(lambda: torch.mm(a, w.t(), out=out), repetitions, min_time / 5):.6f}")
        dw = torch.empty(n, k)
        print(f"gemm_ms {n}x{k}x{batch} TN {fastest_ms(lambda: torch.mm(dy.t(), a, out=dw), repetitions, min_time / 5):.6f}")
        if i == 0:
            continue
        dx = torch.empty(batch, k)
        print(f"gemm_ms {batch}x{k}x{n} NN {fastest_ms(lambda: torch.mm(dy, w, out=dx), repetitions, min_time / 5):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
