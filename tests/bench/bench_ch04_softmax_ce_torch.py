#!/usr/bin/env python3
# Chapter 04 — PyTorch's half of bench_ch04_softmax_ce: softmax
# cross-entropy forward and backward (mean loss, then the logits' gradient)
# on the same shapes through PyTorch on one CPU thread, timed as the C++
# benchmark times its own (CPU time per call, the fastest of the
# repetitions). The C++ benchmark runs this script with the Python it is
# given (--python=PATH or MPT_TORCH_PYTHON) and prints the ratio.
# Depends on: bench_torch_support.py, Python 3 and, optionally, torch (never
# a dependency of the project: without it the script prints "PyTorch not
# importable" and exits 0).
#
#   bench_ch04_softmax_ce_torch.py [--rows=128,512] [--classes=32768]
#                                  [--repetitions=5] [--min-time=0.5]
#
# Three runs per shape, each F.cross_entropy(logits, targets) and
# torch.autograd.grad of the loss with respect to the logits:
#   fp32           FP32 logits, FP32 loss and gradient: what runs without
#                  mixed precision
#   autocast-f16   fp16 logits under torch.autocast("cpu", dtype=float16):
#                  cross_entropy_loss is on the CPU autocast's fp32 list
#                  (aten/src/ATen/autocast_mode.cpp, KERNEL_CPU(
#                  cross_entropy_loss, fp32)), so the logits are cast to
#                  FP32, the loss is FP32, and the backward of that cast
#                  rounds the gradient back to fp16: fp16 in, fp16 out, as
#                  the library's fused call
#   autocast-bf16  the same with bfloat16, the CPU autocast's default dtype
# The logits are N(0, 3²), the targets uniform, as on the C++ side. The C++
# side starts this script with glibc keeping freed blocks
# (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_): the gradient and the
# intermediates allocated on every call cost no page faults.
#
# Output, one result per line, for the C++ side to parse:
#   torch <version> <cpu capability>
#   ce_ms <R>x<K> <run> <fastest ms per call>
import sys

from bench_torch_support import arg, fastest_ms, import_torch


def main():
    rows = [int(r) for r in arg("rows", "128,512").split(",") if r]
    classes = int(arg("classes", "32768"))
    repetitions = int(arg("repetitions", "5"))
    min_time = float(arg("min-time", "0.5"))
    torch = import_torch()
    if torch is None:
        return 0
    import torch.nn.functional as F

    def plain(logits, targets):
        loss = F.cross_entropy(logits, targets)
        return torch.autograd.grad(loss, logits)

    def autocast(dtype):
        def step(logits, targets):
            with torch.autocast("cpu", dtype=dtype):
                loss = F.cross_entropy(logits, targets)
            return torch.autograd.grad(loss, logits)

        return step

    torch.manual_seed(7)
    runs = [("fp32", torch.float32, plain), ("autocast-f16", torch.float16, autocast(torch.float16)),
            ("autocast-bf16", torch.bfloat16, autocast(torch.bfloat16))]
    for r in rows:
        base = torch.randn(r, classes) * 3.0
        targets = torch.randint(0, classes, (r,))
        for name, dtype, step in runs:
            logits = base.to(dtype).requires_grad_()
            ms = fastest_ms(lambda: step(logits, targets), repetitions, min_time)
            print(f"ce_ms {r}x{classes} {name} {ms:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
