#!/usr/bin/python3
"""Runs example 10 (train_fashion_mnist) several times with the same seed and settings and
compares the final parameters and AdamW state bit for bit (the model and optimizer datasets of
each run's last checkpoint, read with h5py, every CRC32C checked: a sharded run's moments as
written from the ranks' parts).

usage: ex10_bitident.py MPIEXEC TRAINER WORKDIR [--runs N] [--derived-runs D] [--np P] [--steps S]
                        [--modes tuning,reproducible,resume[,resume_reproducible]
                                 [,resume_auto][,fused][,sharded][,resume_sharded]
                                 [,resume_sharded_parallel][,none]]

Modes (each N runs from scratch, each in its own run directory; the modes whose parameters must
equal another mode's, and resume_auto, D runs: that the runs of one setting agree with each other
is what the N runs of tuning and reproducible check):
  tuning        DTRAIN_TUNING_FILE shared by the runs; the first run finds no file, calibrates
                and writes it, the later runs read it and choose the same algorithms
  reproducible  DTRAIN_COMM_REPRODUCIBLE=1: every all-reduce adds in rank order
  resume        with the tuning mode's file: each run stops after S/2 steps (--stop-after,
                checkpoint) and a second invocation continues to S; the result must equal the
                tuning mode's uninterrupted runs
  resume_reproducible
                the same in reproducible mode; must equal the reproducible mode's runs
  resume_auto   neither, stopped after S/2 steps and resumed: example 10 keeps the calibration
                in its run directory, so the resumed part must report the same all-reduce
                choice as the first part (runs are not compared with each other: each
                calibrates afresh)
  fused, sharded
                reproducible mode with --step fused (each bucket updated as its average
                arrives) or --step sharded (reduce-scatter, each rank updating its part and
                keeping that part's AdamW moments, all-gather): must equal the reproducible
                mode's runs
  resume_sharded
                --step sharded in reproducible mode, stopped after S/2 steps (the checkpoint
                assembles the moments' parts on rank 0) and resumed: must equal the
                reproducible mode's runs
  resume_sharded_parallel
                the same with --ckpt-strategy parallel_rank0: every rank writes its parts of
                the moments into the checkpoint itself (one MPI-IO file)
  none          neither (the automatic choice calibrates in every run): for contrast, not asserted
Exit 0 when every asserted mode gave one parameter set; prints how many distinct sets each mode
gave.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ex10_lib as lib  # noqa: E402

CLEAN = ("DTRAIN_TUNING_FILE", "DTRAIN_COMM_REPRODUCIBLE", "DTRAIN_ALLREDUCE_ALGO")


class Failed(Exception):
    pass


def run_job(mpiexec, trainer, np_, args, env, what):
    job = lib.Job([mpiexec, "-n", str(np_), trainer] + args, env)
    rc, secs = job.wait(300)
    if rc != 0:
        raise Failed("%s ended with exit code %s after %.1f s:\n%s" % (what, rc, secs,
                                                                       job.output()))
    return job.output(), secs


def final_digest(run_dir, steps):
    ck = lib.checkpoints(run_dir)
    if not ck or ck[-1][0] != steps:
        raise Failed("%s: no checkpoint of step %d (found %s)" % (run_dir, steps,
                                                                [s for s, _ in ck]))
    step, problems, arrays = lib.verify_checkpoint(ck[-1][1])
    if problems:
        raise Failed("%s: %s" % (ck[-1][1], "; ".join(problems)))
    h = hashlib.sha256()
    names = sorted(k for k in arrays if k.startswith(("model/", "optimizer/")))
    for k in names:
        h.update(k.encode() + b"\0" + arrays[k].tobytes())
    return h.hexdigest()[:16]


def allreduce_choice(summary):
    """The all-reduce choice example 10 reports in its --json-summary file ("?" when absent)."""
    try:
        with open(summary) as f:
            return json.load(f).get("allreduce_choice", "?") or "?"
    except (OSError, ValueError):
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mpiexec")
    ap.add_argument("trainer")
    ap.add_argument("work")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--derived-runs", type=int, default=1)
    ap.add_argument("--np", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--modes", default="tuning,reproducible,resume")
    a = ap.parse_args()
    lib.require_h5py()
    modes = a.modes.split(",")
    for m in modes:
        if m not in ("tuning", "reproducible", "resume", "resume_reproducible", "resume_auto",
                     "fused", "sharded", "resume_sharded", "resume_sharded_parallel", "none"):
            ap.error("unknown mode " + m)
    if a.steps < 2:
        ap.error("--steps must be at least 2")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    data = os.path.join(a.work, "data.h5")
    lib.make_data(data, a.np * 16 * a.steps + 64, 96)
    tuning = os.path.join(a.work, "tuning.txt")
    base = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for k in CLEAN:
        base.pop(k, None)
    envs = {"none": base, "tuning": dict(base, DTRAIN_TUNING_FILE=tuning),
            "reproducible": dict(base, DTRAIN_COMM_REPRODUCIBLE="1"),
            "resume": dict(base, DTRAIN_TUNING_FILE=tuning),
            "resume_reproducible": dict(base, DTRAIN_COMM_REPRODUCIBLE="1"),
            "resume_auto": base}
    for m in ("fused", "sharded", "resume_sharded", "resume_sharded_parallel"):
        envs[m] = envs["reproducible"]
    # A mode and the uninterrupted mode whose parameters it must give.
    resumes = {"resume": "tuning", "resume_reproducible": "reproducible", "fused": "reproducible",
               "sharded": "reproducible", "resume_sharded": "reproducible",
               "resume_sharded_parallel": "reproducible"}
    interrupted = ("resume", "resume_reproducible", "resume_auto", "resume_sharded",
                   "resume_sharded_parallel")
    # Buckets of 16 KiB: the model's 26506 parameters in seven buckets, each updated (and
    # sharded) on its own; the reference runs' one bucket gives the same sums in rank order.
    step_args = {"fused": ["--step", "fused", "--bucket-kib", "16"],
                 "sharded": ["--step", "sharded", "--bucket-kib", "16"],
                 "resume_sharded": ["--step", "sharded", "--bucket-kib", "16"],
                 "resume_sharded_parallel": ["--step", "sharded", "--bucket-kib", "16",
                                             "--ckpt-strategy", "parallel_rank0"]}

    def opts(run_dir, extra=()):
        return ["--data", data, "--run-dir", run_dir, "--json-summary", run_dir + ".json", "--hidden", "32", "--batch", "16",
                "--epochs", "1", "--max-steps", str(a.steps), "--target", "0", "--seed", "3",
                "--log-every", str(a.steps), "--no-plot"] + list(extra)

    digests = {}
    choices = {}
    t0 = time.monotonic()
    try:
        for m in modes:
            digests[m] = []
            if m in resumes and not digests.get(resumes[m]):
                # The uninterrupted reference (which also writes the tuning file).
                run_dir = os.path.join(a.work, m + "-reference")
                run_job(a.mpiexec, a.trainer, a.np, opts(run_dir), envs[resumes[m]],
                        "reference run")
                digests[resumes[m]] = [final_digest(run_dir, a.steps)]
            runs = a.derived_runs if m in resumes or m == "resume_auto" else a.runs
            for i in range(runs):
                run_dir = os.path.join(a.work, "%s-%02d" % (m, i))
                extra = step_args.get(m, [])
                if m in interrupted:
                    half = a.steps // 2
                    run_job(a.mpiexec, a.trainer, a.np,
                            opts(run_dir, extra + ["--stop-after", str(half)]), envs[m],
                            "resume run %d, first part" % i)
                    first_choice = allreduce_choice(run_dir + ".json")
                    out, _ = run_job(a.mpiexec, a.trainer, a.np, opts(run_dir, extra), envs[m],
                                     "resume run %d, second part" % i)
                    if "resuming from step %d" % half not in out:
                        raise Failed("resume run %d did not resume from step %d:\n%s" %
                                     (i, half, out))
                    choice = allreduce_choice(run_dir + ".json")
                    if choice != first_choice:
                        if m == "resume_auto":
                            raise Failed("resume run %d chose %s before the stop and %s after it"
                                         " (the run directory's calibration was not reused)" %
                                         (i, first_choice, choice))
                        choice = first_choice + " then " + choice
                else:
                    run_job(a.mpiexec, a.trainer, a.np, opts(run_dir, extra), envs[m],
                            "%s run %d" % (m, i))
                    if m == "tuning" and i == 0 and not os.path.exists(tuning):
                        raise Failed("the first run did not write the tuning file " + tuning)
                    choice = allreduce_choice(run_dir + ".json")
                digests[m].append(final_digest(run_dir, a.steps))
                choices.setdefault(m, []).append(choice)
                shutil.rmtree(run_dir)
            print("%-12s %d runs, %d distinct parameter sets: %s" %
                  (m, runs, len(set(digests[m])), " ".join(digests[m])), flush=True)
            # Which parameter set each all-reduce choice gave.
            for ch in sorted(set(choices[m])):
                sets = sorted({d for d, c in zip(digests[m], choices[m]) if c == ch})
                print("    %d runs chose %s -> %s" % (choices[m].count(ch), ch, " ".join(sets)))
    except Failed as e:
        print("FAIL: %s" % e)
        return 1
    print("%d ranks, %d steps, %.0f s" % (a.np, a.steps, time.monotonic() - t0))
    bad = [m for m in modes if m not in ("none", "resume_auto") and len(set(digests[m])) != 1]
    for m, ref in resumes.items():
        if m in modes and set(digests[m]) != {digests[ref][0]}:
            print("FAIL: %s: the resumed runs' parameters differ from the uninterrupted runs' (%s)"
                  % (m, digests[ref][0]))
            bad.append(m + " vs " + ref)
    if bad:
        print("FAIL: more than one parameter set in: " + ", ".join(bad))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
