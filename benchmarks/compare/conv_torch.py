#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch CPU baseline for dtrain's Conv2d stack benchmark (benchmarks/conv_bench.cpp).

Times forward + backward (wall clock, and the process's CPU time) (parameter and input gradients) of the surrogate stack
Conv2d(1->32, 3x3, pad 1) ReLU Conv2d(32->32) ReLU Conv2d(32->1) on a [16, 1, 64, 64] batch,
float32, one thread by default, and prints the median milliseconds per step and GFLOP/s
(2 x multiply-adds of the three convolutions, forward + 2 x for backward).

Usage: /usr/bin/python3 benchmarks/compare/conv_torch.py [--threads 1] [--reps 30] [--batch 16]
"""
import argparse
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--grid", type=int, default=64)
    ap.add_argument("--channels", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = a.channels
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, c, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(c, 1, 3, padding=1))
    x = torch.randn(a.batch, 1, a.grid, a.grid)
    y = torch.randn(a.batch, 1, a.grid, a.grid)
    times, cpu = [], []
    for i in range(a.warmup + a.reps):
        t0, c0 = time.perf_counter(), time.process_time()
        model.zero_grad(set_to_none=False)
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        loss.backward()
        t1, c1 = time.perf_counter(), time.process_time()
        if i >= a.warmup:
            times.append(t1 - t0)
            cpu.append(c1 - c0)
    ms = statistics.median(times) * 1e3
    cpu_ms = statistics.median(cpu) * 1e3
    pixels = a.batch * a.grid * a.grid
    macs = pixels * 9 * (1 * c + c * c + c * 1)
    flops = 2 * macs * 3  # forward, input gradient, weight gradient
    print(f"torch {torch.__version__} threads={a.threads} batch={a.batch} grid={a.grid} "
          f"channels={c}: median {ms:.2f} ms/step ({cpu_ms:.2f} ms CPU), "
          f"{flops / (ms * 1e-3) / 1e9:.2f} GFLOP/s")


if __name__ == "__main__":
    main()
