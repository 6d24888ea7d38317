#!/usr/bin/python3
"""Checks what a user of train_fashion_mnist sees when something is wrong, and resumes.

  check_train_ux.py bad-input MPIEXEC TRAINER   bad options, MPMD ranks that disagree, bad data
                                                (labels, NaN/Inf, shapes, types, empty set), a
                                                locked run directory: each must end the job with
                                                a non-zero exit code and a message naming the
                                                problem (option, rank, file row)
  check_train_ux.py resume MPIEXEC TRAINER      a run stopped on 2 ranks and resumed on 1 finishes
                                                its epoch (steps counted independently); metrics
                                                and timing files hold each step once; a changed
                                                schedule is refused unless --override-schedule;
                                                node-local checkpoints from DTRAIN_CKPT_LOCAL_DIR
                                                restore, another run's are refused

Small HDF5 files are written with h5py (exit 77 when it is missing)."""
import fcntl
import json
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"SKIPPED: {e} (Debian: apt-get install python3-h5py)")
    sys.exit(77)

FAILURES = []


def make_file(path, n_train=256, n_test=64, train_dtype=np.uint8, test_dtype=np.uint8,
              test_shape=(28, 28), num_classes_attr=True, edit=None):
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        for group, n, dtype, shape in (("train", n_train, train_dtype, (28, 28)),
                                       ("test", n_test, test_dtype, test_shape)):
            labels = (np.arange(n) % 10).astype(np.uint8)
            # Learnable: the label's value lights up one band of rows.
            images = rng.integers(0, 40, size=(n,) + shape).astype(np.float64)
            for i in range(n):
                images[i, 2 * labels[i]:2 * labels[i] + 3, :] += 200
            images = images.astype(dtype)
            if edit:
                edit(group, images, labels)
            f.create_dataset(group + "/images", data=images)
            d = f.create_dataset(group + "/labels", data=labels)
            if num_classes_attr:
                d.attrs["num_classes"] = np.int64(10)


def run(cmd, timeout=120, extra_env=None):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **(extra_env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr


def expect(name, rc, text, want_rc, words):
    ok = rc == want_rc and all(w in text for w in words)
    # The first line of an error is what a user reads: show it.
    shown = "\n     ".join(text.strip().splitlines()[-3:])
    print(f"{'ok  ' if ok else 'FAIL'} {name}: rc {rc} (want {want_rc})\n     {shown}")
    if not ok:
        print(f"     expected words: {words}\n----- full output -----\n{text}\n-----")
        FAILURES.append(name)


def bad_input(mpiexec, trainer, tmp):
    good = os.path.join(tmp, "good.h5")
    make_file(good)
    base = [mpiexec, "-n", "2", trainer, "--hidden", "16", "--batch", "16", "--epochs", "1",
            "--target", "0"]

    for name, extra, words in (
            ("--lr abc", ["--lr", "abc"], ["--lr", "'abc' is not a finite number"]),
            ("--batch 64abc", ["--batch", "64abc"], ["--batch", "64abc"]),
            ("--epochs -1", ["--epochs", "-1"], ["--epochs"]),
            ("--max-steps 0", ["--max-steps", "0"], ["--max-steps 0", "nothing to train"]),
            ("--lr out of range", ["--lr", "1e3"], ["--lr", "outside"])):
        rc, text = run(base + ["--data", good] + extra)
        expect(name, rc, text, 2, words)

    # MPMD: the second rank was given another batch size.
    rc, text = run([mpiexec, "-n", "1", trainer, "--data", good, "--hidden", "16", "--batch", "16",
                    "--target", "0", ":", "-n", "1", trainer, "--data", good, "--hidden", "16",
                    "--batch", "32", "--target", "0"])
    expect("MPMD ranks with different --batch", rc, text, 1,
           ["rank 1 has --batch 32", "rank 0 has --batch 16"])

    def case(name, words, **kw):
        path = os.path.join(tmp, name.replace(" ", "_").replace("/", "_") + ".h5")
        make_file(path, **kw)
        rc, text = run(base + ["--data", path])
        expect(name, rc, text, 1, words)

    def test_label_10(group, images, labels):
        if group == "test":
            labels[6] = 10

    def train_label_12(group, images, labels):
        if group == "train":
            labels[200] = 12

    def nan_train(group, images, labels):
        if group == "train":
            images[131, 3, 4] = np.nan

    def inf_test(group, images, labels):
        if group == "test":
            images[50, 0, 0] = np.inf

    # Without a num_classes attribute only the model's 10 classes bound the labels.
    case("test label out of range", ["test/labels", "row 6", "label 10"], edit=test_label_10,
         num_classes_attr=False)
    case("train label out of range", ["train/labels", "200", "label 12"], edit=train_label_12)
    case("NaN in train images", ["train/images", "row 131", "NaN"], edit=nan_train,
         train_dtype=np.float32, test_dtype=np.float32)
    case("Inf in test images", ["test/images", "row 50", "Inf"], edit=inf_test,
         train_dtype=np.float64, test_dtype=np.float64)
    case("train and test shapes differ", ["shape", "[28, 28]", "[14, 14]"], test_shape=(14, 14))
    case("train and test types differ", ["unsigned bytes", "another type"],
         test_dtype=np.float32)
    case("empty training set", ["training set is empty"], n_train=0)

    # A run directory in use by another job (this script holds its lock).
    run_dir = os.path.join(tmp, "locked-run")
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "lock"), "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.write("host test, pid %d" % os.getpid())
        holder.flush()
        rc, text = run(base + ["--data", good, "--run-dir", run_dir])
        expect("run directory locked by another job", rc, text, 1,
               ["in use by another job", "pid %d" % os.getpid()])
    # Released: the same command now trains.
    rc, text = run(base + ["--data", good, "--run-dir", run_dir, "--max-steps", "3"])
    expect("run directory free again", rc, text, 0, ["test accuracy"])


def steps_in(csv_path, need_column=None):
    with open(csv_path) as f:
        header = f.readline().strip().split(",")
        rows = [line.strip().split(",") for line in f if line.strip()]
    col = header.index(need_column) if need_column else None
    return [int(r[0]) for r in rows if col is None or r[col] != ""]


def resume(mpiexec, trainer, tmp):
    data = os.path.join(tmp, "data.h5")
    make_file(data, n_train=1000, n_test=100)
    run_dir = os.path.join(tmp, "run")
    summary = os.path.join(tmp, "summary.json")
    opts = ["--data", data, "--hidden", "16", "--batch", "16", "--epochs", "1", "--target", "0",
            "--run-dir", run_dir, "--log-every", "5", "--json-summary", summary]

    # 2 ranks, stopped after 10 steps: 10 * 16 * 2 = 320 of 1000 samples consumed.
    rc, text = run([mpiexec, "-n", "2", trainer] + opts + ["--stop-after", "10"])
    expect("2 ranks stop after 10 steps", rc, text, 0, ["stopped after 10 steps", "step 10 of"])
    # A job that died after its checkpoint leaves rows past it; the resumed run writes them anew.
    with open(os.path.join(run_dir, "metrics.csv"), "a") as f:
        f.write("15,0,9.75,0.001,,,1000,0.1,0.1,0.1,0.1\n")
    # 1 rank continues the epoch: 680 samples left, ceil(680 / 16) = 43 more steps.
    rc, text = run([mpiexec, "-n", "1", trainer] + opts)
    expect("1 rank resumes the 2-rank epoch", rc, text, 0,
           ["resuming from step 10", "written by 2 ranks", "sample 320 of 1000"])
    with open(summary) as f:
        s = json.load(f)
    ok = s["steps"] == 53 and s["resumed_from_step"] == 10 and s["epochs"] == 1 and \
        s["complete"] is True and s["world_size"] == 1
    print(f"{'ok  ' if ok else 'FAIL'} summary after the resized resume: steps {s['steps']} "
          f"(want 10 + 43 = 53), resumed_from_step {s['resumed_from_step']}, epochs {s['epochs']}")
    if not ok:
        FAILURES.append("resized resume summary")

    # Each interval step appears once in metrics.csv although two runs wrote it.
    interval = steps_in(os.path.join(run_dir, "metrics.csv"), "loss")
    want = [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 53]
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        stale = [line for line in f if line.startswith("15,") and ",9.75," in line]
    ok = interval == want and not stale
    print(f"{'ok  ' if ok else 'FAIL'} metrics.csv interval rows {interval}, stale rows {stale}")
    if not ok:
        FAILURES.append("metrics.csv rows")
    epoch_rows = steps_in(os.path.join(run_dir, "metrics.csv"), "test_accuracy")
    ok = epoch_rows == [53]
    print(f"{'ok  ' if ok else 'FAIL'} metrics.csv epoch rows {epoch_rows}")
    if not ok:
        FAILURES.append("metrics.csv epoch rows")
    r0 = steps_in(os.path.join(run_dir, "timing-rank-00000.csv"))
    r1 = steps_in(os.path.join(run_dir, "timing-rank-00001.csv"))
    ok = r0 == want and r1 == [5, 10]
    print(f"{'ok  ' if ok else 'FAIL'} per-rank timing rows: rank 0 {r0}, rank 1 {r1}")
    if not ok:
        FAILURES.append("timing rows")

    # Run again: nothing left to do, and it says how to start afresh.
    rc, text = run([mpiexec, "-n", "1", trainer] + opts)
    expect("complete run says so", rc, text, 0, ["is complete", "start a fresh run"])
    # Another schedule is refused, then accepted with the explicit flag.
    opts2 = [o if o != "1" or opts[i - 1] != "--epochs" else "2" for i, o in enumerate(opts)]
    rc, text = run([mpiexec, "-n", "1", trainer] + opts2)
    expect("changed --epochs refused", rc, text, 1, ["--epochs 1 (now 2)", "--override-schedule"])
    rc, text = run([mpiexec, "-n", "1", trainer] + opts2 + ["--override-schedule"])
    expect("changed --epochs with --override-schedule", rc, text, 0,
           ["new schedule", "epoch 2/2 done"])
    with open(summary) as f:
        s = json.load(f)
    ok = s["steps"] == 53 + 63 and s["epochs"] == 2
    print(f"{'ok  ' if ok else 'FAIL'} second epoch: steps {s['steps']} (want 53 + 63 = 116)")
    if not ok:
        FAILURES.append("override schedule steps")

    # Multi-level checkpoints from the batch script's variable alone (2 ranks as 2 fake nodes, one
    # node-local path): saved there and flushed to the run directory, restored from there.
    local = os.path.join(tmp, "local")
    lv_env = {"DTRAIN_RANKS_PER_NODE": "1", "DTRAIN_CKPT_LOCAL_DIR": local,
              "DTRAIN_LOG_LEVEL": "info"}
    lv_opts = [o if o != run_dir else run_dir + "-levels" for o in opts]
    rc, text = run([mpiexec, "-n", "2", trainer] + lv_opts + ["--stop-after", "10"],
                   extra_env=lv_env)
    expect("levels from DTRAIN_CKPT_LOCAL_DIR", rc, text, 0,
           ["node-local in " + local + " on 2 nodes (copied to the next node)", "step 10 of"])
    name = "ckpt-000000000010.h5"
    ok = os.path.exists(os.path.join(local, name)) and \
        os.path.exists(os.path.join(run_dir + "-levels", name))
    print(f"{'ok  ' if ok else 'FAIL'} {name} node-local and flushed to the run directory")
    if not ok:
        FAILURES.append("node-local checkpoint files")
    rc, text = run([mpiexec, "-n", "2", trainer] + lv_opts + ["--stop-after", "5"],
                   extra_env=lv_env)
    expect("levels restore node-local", rc, text, 0,
           ["restored step 10 from the node-local level", "resuming from step 10"])
    # Another run directory, the same node-local directory: that run's copies are not restored.
    lv_other = [o if o != run_dir else run_dir + "-other" for o in opts]
    rc, text = run([mpiexec, "-n", "2", trainer] + lv_other + ["--stop-after", "5"],
                   extra_env=lv_env)
    expect("another run's node-local copies refused", rc, text, 0,
           ["not restoring the node-local checkpoint", "it belongs to run", "step 5 of"])
    if "resuming from" in text:
        FAILURES.append("another run's node-local copy restored")


def main():
    what, mpiexec, trainer = sys.argv[1], sys.argv[2], sys.argv[3]
    with tempfile.TemporaryDirectory() as tmp:
        {"bad-input": bad_input, "resume": resume}[what](mpiexec, trainer, tmp)
    if FAILURES:
        print("FAILED:", ", ".join(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
