# Chapters 02 onwards — what the PyTorch halves of the CPU benchmarks
# (bench_ch*_torch.py, run by bench_torch.hpp's run_torch_script) share:
# their --name=value options, the timing loop, and the import of torch that
# prints the status line or says why there is none.
# Depends on: Python 3 and, optionally, torch (never a dependency of the
# project).
import sys
import time


def arg(name, default):
    """The value of --name=value on the command line, or default."""
    for a in sys.argv[1:]:
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1]
    return default


def fastest_ms(f, repetitions, min_time):
    """The fastest over `repetitions` runs of the mean CPU time of f, each
    run repeating f for at least min_time seconds (as Google Benchmark's
    repetitions with CPU time)."""
    f()
    f()  # warm: allocations, an optimizer's momentum buffers
    best = float("inf")
    for _ in range(repetitions):
        n, start = 0, time.process_time()
        while True:
            f()
            n += 1
            spent = time.process_time() - start
            if spent >= min_time:
                break
        best = min(best, 1e3 * spent / n)
    return best


def import_torch():
    """torch on one thread, its status line printed ("torch VERSION
    CAPABILITY"); None, with "PyTorch not importable (why)" printed, when
    it cannot be imported."""
    import warnings

    warnings.filterwarnings("ignore")  # e.g. torch without numpy: not ours to report
    try:
        import torch
    except Exception as e:  # torch is optional: measuring only
        print(f"PyTorch not importable ({e.__class__.__name__}: {e})")
        return None
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    print(f"torch {torch.__version__} {capability}", flush=True)
    return torch
