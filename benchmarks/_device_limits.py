"""The two ceilings of a device, measured in the run that uses them (benchmarks/performance.md reports every GPU
number as a fraction of limits measured alongside it, never of a datasheet alone).

    matmul_tflops(device, dtype)   dense matrix-product rate: the median of timed n x n x n products on random data
    copy_bandwidth(device)         memory bandwidth: a large device-to-device copy, bytes read + bytes written
"""

from __future__ import annotations

import statistics
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _timed(device: torch.device, fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` timed calls after three warm-ups (device events on CUDA)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def matmul_tflops(
    device: str | torch.device, dtype: torch.dtype = torch.bfloat16, n: int | None = None, repeats: int = 10
) -> float:
    """Measured dense rate of an n x n x n product in dtype (TFLOP/s); n defaults to 8192 on a GPU (fills it) and 512
    elsewhere (a quick check of a script). float32 on CUDA runs without TF32 (torch's default), the arithmetic exact
    search uses."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 512)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = _timed(device, lambda: torch.mm(a, b, out=out), repeats)
    return 2 * n**3 / seconds / 1e12


def copy_bandwidth(device: str | torch.device, num_bytes: int | None = None, repeats: int = 10) -> float:
    """Measured memory bandwidth (GB/s) of a device-to-device copy of num_bytes (default 2^32 on a GPU, 2^26
    elsewhere), counting bytes read and written."""
    device = torch.device(device)
    num_bytes = num_bytes or (2**32 if device.type == "cuda" else 2**26)
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _timed(device, lambda: dst.copy_(src), repeats)
    return 2 * num_bytes / seconds / 1e9


def describe(device: str | torch.device) -> str:
    """The device, driver and library versions, for the header of a result."""
    device = torch.device(device)
    if device.type != "cuda":
        import platform

        return f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    props = torch.cuda.get_device_properties(device)
    return (
        f"{props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
