#!/usr/bin/python3
"""PyTorch counterpart of benchmarks/model_bench (a benchmark, never a test dependency).

The same two models (the Fashion-MNIST CNN classifier, batch 64 per rank, softmax cross-entropy;
the in-situ surrogate's CNN on a 40 x 64 tile with circular padding, batch 2 per rank, MSE), AdamW
(lr 1e-3, weight decay 0.01), synthetic data already in memory (8 batches per rank, cycled), CPU,
DistributedDataParallel over gloo, one thread per rank. Like model_bench, each round measures
rank 0 alone on a one-rank group while rank 1 waits, then both ranks; samples/s is the median over
the rounds. Then, on rank 0, each module of the model timed alone (forward, then backward of its
output with a random gradient; the first convolution computes no input gradient), CPU ms, median of
--layer-reps, with each kind's share of the 1-rank step's CPU time (every thread of the process). With --epochs N the CNN also trains N
epochs on Fashion-MNIST on both ranks (each rank its half of a permutation per epoch, pixels / 255)
and rank 0 prints the test accuracy.

Debian 12: apt-get install python3-torch (PyTorch 1.13). Run, from the repository root:
  OMP_NUM_THREADS=1 /usr/bin/python3 benchmarks/compare/model_torch.py [--models cnn,surrogate]
      [--steps 40] [--warmup 5] [--rounds 3] [--layer-reps 20] [--epochs 0]
It starts its two ranks itself (torch.multiprocessing, rendezvous on 127.0.0.1).
"""
import argparse
import gzip
import os
import statistics
import sys
import time

BATCH = {"cnn": 64, "surrogate": 2}


def build(name):
    import torch.nn as nn

    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                             nn.Linear(128, 10))

    class Residual(nn.Module):
        def __init__(self, *body):
            super().__init__()
            self.body = nn.Sequential(*body)

        def forward(self, x):
            return x + self.body(x)

    def conv(i, o):
        return nn.Conv2d(i, o, 3, padding=1, padding_mode="circular")

    return nn.Sequential(conv(1, 8), Residual(nn.ReLU(), conv(8, 8), nn.ReLU(), conv(8, 8)),
                         conv(8, 1))


def shapes(name):
    return (1, 28, 28) if name == "cnn" else (1, 40, 64)


def cpu_time():
    return time.process_time()


def time_layers(name, reps):
    """Each module alone on the model's shapes: (kind, forward ms, backward ms), CPU time."""
    import torch
    import torch.nn as nn

    model = build(name)
    batch = BATCH[name]
    x = torch.randn(batch, *shapes(name))
    rows = []
    for i, m in enumerate(model):
        xi = x.detach().clone().requires_grad_(i > 0)
        y = m(xi)
        dy = torch.randn_like(y)
        f, b = [], []
        for r in range(reps + 2):
            t0 = cpu_time()
            y = m(xi)
            t1 = cpu_time()
            y.backward(dy)
            t2 = cpu_time()
            if r >= 2:
                f.append(t1 - t0)
                b.append(t2 - t1)
        kind = type(m).__name__.lower()
        if isinstance(m, nn.Sequential):
            kind = "residual"
        rows.append((kind, 1e3 * statistics.median(f), 1e3 * statistics.median(b)))
        x = y.detach()
    return rows


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return data[4 + 4 * dims:], shape


def worker(rank, args, queue):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    solo = dist.new_group([0])
    results = {}
    for name in args.models:
        batch = BATCH[name]
        gen = torch.Generator().manual_seed(7 + rank)
        data = []
        for _ in range(8):
            x = torch.randn(batch, *shapes(name), generator=gen)
            y = (torch.randint(0, 10, (batch,), generator=gen) if name == "cnn"
                 else torch.randn(batch, *shapes(name), generator=gen))
            data.append((x, y))
        loss_fn = nn.CrossEntropyLoss() if name == "cnn" else nn.MSELoss()

        def measure(group, world):
            torch.manual_seed(1)
            model = nn.parallel.DistributedDataParallel(build(name), process_group=group)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

            def step(i):
                x, y = data[i % len(data)]
                opt.zero_grad(set_to_none=False)
                loss_fn(model(x), y).backward()
                opt.step()

            for i in range(args.warmup):
                step(i)
            dist.barrier(group=group)
            t0, c0 = time.perf_counter(), cpu_time()
            for i in range(args.steps):
                step(i)
            cpu_ms = 1e3 * (cpu_time() - c0) / args.steps
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
            return args.steps * batch * world / float(elapsed[0]), cpu_ms

        ones, twos = [], []
        for _ in range(args.rounds):
            if rank == 0:
                ones.append(measure(solo, 1))
            dist.barrier()
            twos.append(measure(dist.group.WORLD, 2)[0])
        layers = time_layers(name, args.layer_reps) if rank == 0 else None
        acc = None
        if args.epochs > 0 and name == "cnn":
            t0 = time.perf_counter()
            acc = train_epochs(args, rank, torch, nn, dist)
            acc = (acc, time.perf_counter() - t0)
        results[name] = (ones, twos, layers, acc)
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def train_epochs(args, rank, torch, nn, dist):
    d = args.data + "/"
    images, ishape = read_idx(d + "train-images-idx3-ubyte.gz")
    labels, _ = read_idx(d + "train-labels-idx1-ubyte.gz")
    timages, tshape = read_idx(d + "t10k-images-idx3-ubyte.gz")
    tlabels, _ = read_idx(d + "t10k-labels-idx1-ubyte.gz")
    x_all = torch.frombuffer(bytearray(images), dtype=torch.uint8).view(-1, 1, 28, 28)
    y_all = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
    tx = torch.frombuffer(bytearray(timages), dtype=torch.uint8).view(-1, 1, 28, 28).float() / 255
    ty = torch.frombuffer(bytearray(tlabels), dtype=torch.uint8).long()
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(build("cnn"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    n, batch = x_all.shape[0], BATCH["cnn"]
    per_rank = n // 2
    for e in range(args.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + e))
        mine = order[rank * per_rank:(rank + 1) * per_rank]
        for s in range(per_rank // batch):
            idx = mine[s * batch:(s + 1) * batch]
            opt.zero_grad(set_to_none=False)
            loss_fn(model(x_all[idx].float() / 255), y_all[idx]).backward()
            opt.step()
    with torch.no_grad():
        pred = model.module(tx).argmax(1)
    return float((pred == ty).float().mean())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="cnn,surrogate")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layer-reps", type=int, default=20)
    p.add_argument("--epochs", type=int, default=0)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--port", type=int, default=29523)
    args = p.parse_args()
    args.models = args.models.split(",")
    if any(m not in BATCH for m in args.models) or min(args.steps, args.rounds) < 1:
        p.error("models are cnn and surrogate; --steps and --rounds must be >= 1")
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"model_torch: {e} (Debian: apt-get install python3-torch)", file=sys.stderr)
        return 77
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(args, queue), nprocs=2, join=True, start_method="spawn")
    results = queue.get()
    print(f"# model_torch: PyTorch {torch.__version__} DDP (gloo, 1 thread per rank), AdamW, "
          f"{args.steps} timed steps, synthetic data; median of {args.rounds} round(s)")
    for name in args.models:
        rates, twos, layers, acc = results[name]
        ones = [r[0] for r in rates]
        s1, s2 = statistics.median_low(ones), statistics.median_low(twos)
        print(f"{name} batch {BATCH[name]}/rank: 1 rank {s1:.1f} samples/s (rounds "
              f"{' '.join(f'{v:.1f}' for v in ones)}), 2 ranks {s2:.1f} samples/s (rounds "
              f"{' '.join(f'{v:.1f}' for v in twos)}), scaling efficiency {s2 / (2 * s1):.3f}")
        step_ms = statistics.median_low([r[1] for r in rates])
        print(f"# {name}, 1 rank: modules one by one (CPU ms, median of the reps)")
        kinds = {}
        for kind, f, b in layers:
            print(f"  {kind:<26} {f:9.3f} {b:9.3f} {f + b:9.3f} {100 * (f + b) / step_ms:7.1f}%")
            kinds[kind] = kinds.get(kind, 0.0) + f + b
        rest = step_ms - sum(kinds.values())
        print(f"# by kind (share of the 1-rank step's {step_ms:.3f} CPU ms): " +
              " ".join(f"{k} {100 * v / step_ms:.1f}%" for k, v in kinds.items()) +
              f" rest {100 * rest / step_ms:.1f}%")
        if acc is not None:
            print(f"{name}: test accuracy {acc[0]:.4f} after {args.epochs} epochs on 2 ranks "
                  f"({acc[1]:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
