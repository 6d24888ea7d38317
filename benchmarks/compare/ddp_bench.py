#!/usr/bin/python3
"""PyTorch DistributedDataParallel counterpart of benchmarks/train_bench (a benchmark, never a test
dependency).

Same model (MLP 784-H-H-10, ReLU, softmax cross-entropy), same per-rank batch, same optimizer
(AdamW, or SGD with momentum 0.9), synthetic data, CPU, gloo backend, one thread per rank. Like
train_bench it measures 1 rank and 2 ranks in one run: rank 0 alone on a one-rank process group
while rank 1 sleeps, then both ranks on the world group. Prints samples/s, the scaling efficiency,
the CPU cores each figure used and, with --json FILE, the same keys as train_bench's overlap mode.

Debian 12: apt-get install python3-torch (PyTorch 1.13). Run, from the repository root:
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 benchmarks/compare/ddp_bench.py \\
      --hidden 256 --batch 64 --optimizer adamw --steps 300 --json ddp.json
It starts its two ranks itself (torch.multiprocessing, rendezvous on 127.0.0.1).
"""
import argparse
import json
import os
import resource
import sys
import time


def positive(text):
    v = int(text, 10)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return v


def cpu_seconds():
    """CPU seconds of this process so far, every thread (user and system), as train_bench."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def median_pair(pairs):
    """The (samples/s, cores) pair with the median samples/s (of an even count, the lower of the
    middle two, as train_bench)."""
    ordered = sorted(pairs, key=lambda x: x[0])
    return ordered[(len(ordered) - 1) // 2]


def worker(rank, args, queue):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    solo = dist.new_group([0])  # every rank must call new_group

    def build():
        torch.manual_seed(args.seed)
        return nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(),
                             nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                             nn.Linear(args.hidden, 10))

    gen = torch.Generator().manual_seed(args.seed + rank)
    batches = [(torch.randn(args.batch, 784, generator=gen),
                torch.randint(0, 10, (args.batch,), generator=gen)) for _ in range(64)]

    def measure(group, world):
        model = nn.parallel.DistributedDataParallel(build(), process_group=group)
        if args.optimizer == "adamw":
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()

        def step(i):
            x, y = batches[i % len(batches)]
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP all-reduces gradient buckets while backward runs
            opt.step()

        for i in range(args.warmup):
            step(i)
        dist.barrier(group=group)
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        for i in range(args.steps):
            step(i)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        cpu = torch.tensor([cpu_seconds() - cpu0], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM, group=group)
        # samples/s, and the cores the group's processes used while timed (all their threads)
        return (args.steps * args.batch * world / float(elapsed[0]),
                float(cpu[0]) / float(elapsed[0]))

    # Each round measures 1 rank, then 2 ranks, as train_bench's --rounds does; each figure is the
    # median over the rounds (with the cores of the same round).
    ones, twos = [], []
    for _ in range(args.rounds):
        if rank == 0:
            ones.append(measure(solo, 1))
        # Rank 1 waits asleep (gloo's barrier would block in a receive, not spin).
        dist.barrier()
        twos.append(measure(dist.group.WORLD, 2))
    if rank == 0:
        effs = [t[0] / (2 * o[0]) for o, t in zip(ones, twos)]
        queue.put((median_pair(ones), median_pair(twos), effs))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=positive, default=256)
    p.add_argument("--batch", type=positive, default=64, help="samples per rank per step")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--steps", type=positive, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=positive, default=1,
                   help="rounds of the 1- and 2-rank figures; each figure the median over them")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"ddp_bench: {e} (Debian: apt-get install python3-torch)", file=sys.stderr)
        return 77
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(args, queue), nprocs=2, join=True, start_method="spawn")
    (sps1, cores1), (sps2, cores2), round_effs = queue.get()
    eff = sps2 / (2 * sps1)
    print(f"# ddp_bench: PyTorch {torch.__version__} DDP (gloo, 1 thread per rank), MLP 784-"
          f"{args.hidden}-{args.hidden}-10, {args.optimizer}, batch {args.batch} per rank, "
          f"{args.steps} timed steps, synthetic data; median of {args.rounds} round(s)")
    print(f"  1 rank {sps1:.0f} samples/s, 2 ranks {sps2:.0f} samples/s, efficiency {eff:.3f}")
    if args.rounds > 1:
        print(f"# efficiency of the single rounds (min - max): {min(round_effs):.3f} - "
              f"{max(round_effs):.3f}")
    print(f"# CPU cores used while timed (every thread of the group's processes over wall time), "
          f"1 rank / 2 ranks: {cores1:.2f} / {cores2:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"framework": f"pytorch-{torch.__version__}-ddp-gloo",
                       "model": f"mlp-784-{args.hidden}-{args.hidden}-10",
                       "optimizer": args.optimizer, "batch_per_rank": args.batch,
                       "steps": args.steps, "samples_per_s_1": sps1, "samples_per_s_2": sps2,
                       "scaling_efficiency": eff, "rounds": args.rounds,
                       "scaling_efficiency_round_min": min(round_effs),
                       "scaling_efficiency_round_max": max(round_effs),
                       "cpu_cores_1": cores1,
                       "cpu_cores_2": cores2}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
