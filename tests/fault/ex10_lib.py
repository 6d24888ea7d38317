"""Helpers shared by the scripts that run example 10 (train_fashion_mnist) under mpiexec:
a small learnable HDF5 dataset in example 01's layout, the run directory's checkpoints, and
their independent verification with h5py (every dataset's @crc32c recomputed here, as
docs/checkpoint-format.md specifies).

Needs h5py and numpy (Debian: python3-h5py); the scripts exit 77 without them."""
import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time

try:
    import h5py
    import numpy as np
except ImportError as e:  # the callers turn this into a skip
    h5py = None
    IMPORT_ERROR = str(e)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
if h5py is not None:
    from check_schema import crc32c  # noqa: E402  (the checker's own CRC32C, no dtrain code)

SKIP = 77


def require_h5py():
    if h5py is None:
        print("SKIPPED: %s (Debian: apt-get install python3-h5py)" % IMPORT_ERROR)
        sys.exit(SKIP)


def make_data(path, n_train, n_test, bad_label_row=None, bad_label=10):
    """Writes train/{images,labels} and test/{images,labels} (uint8 28x28 images, uint8 labels
    with @num_classes = 10) as example 01 does. Each label lights up its own band of rows, so the
    model learns. With bad_label_row, that training row gets label `bad_label`."""
    rng = np.random.default_rng(7)
    with h5py.File(path, "w") as f:
        for group, n in (("train", n_train), ("test", n_test)):
            labels = (np.arange(n) * 7 % 10).astype(np.uint8)
            images = rng.integers(0, 40, size=(n, 28, 28)).astype(np.int32)
            for i in range(n):
                images[i, 2 * labels[i]:2 * labels[i] + 3, :] += 200
            if group == "train" and bad_label_row is not None:
                labels[bad_label_row] = bad_label
            f.create_dataset(group + "/images", data=images.astype(np.uint8))
            d = f.create_dataset(group + "/labels", data=labels)
            d.attrs["num_classes"] = np.int64(10)


CKPT_RE = re.compile(r"^ckpt-(\d{12})\.h5$")


def checkpoints(run_dir):
    """[(step, path)] of the complete checkpoints in run_dir, oldest first."""
    out = []
    for p in glob.glob(os.path.join(run_dir, "ckpt-*.h5")):
        m = CKPT_RE.match(os.path.basename(p))
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def verify_checkpoint(path):
    """Reads a checkpoint with h5py and recomputes every dataset's CRC32C. Returns (step, problems,
    {dataset path: numpy array}); problems is empty when the file is intact."""
    problems = []
    arrays = {}
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
            fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
            if fmt != "dtrain-checkpoint":
                problems.append("@format is %r" % fmt)
            step = int(f.attrs["step"])
            count = [0]

            def visit(name, obj):
                if isinstance(obj, h5py.Dataset) and name != "config":
                    a = obj[()]
                    arrays[name] = a
                    dtype = obj.attrs["dtype"]
                    dtype = dtype.decode() if isinstance(dtype, bytes) else str(dtype)
                    want = {"f32": "<f4", "f64": "<f8", "i32": "<i4", "i64": "<i8"}.get(dtype)
                    if want is None:
                        problems.append("%s: unexpected dtype %s" % (name, dtype))
                        return
                    got = crc32c(np.asarray(a).astype(want).tobytes())
                    if got != int(obj.attrs["crc32c"]):
                        problems.append("%s: crc32c %08x, stored %08x" %
                                        (name, got, int(obj.attrs["crc32c"])))
                    count[0] += 1

            f.visititems(visit)
            if not any(k.startswith("model/") for k in arrays):
                problems.append("no model/ datasets")
    except (OSError, KeyError, ValueError) as e:
        return None, ["unreadable: %s" % e], {}
    return step, problems, arrays


def rank_pids(tag, rank):
    """Pids of the processes whose environment holds DTRAIN_FAULT_JOB=tag and PMI_RANK=rank (the
    MPI ranks that mpiexec started for this job; hydra sets PMI_RANK)."""
    want = ("DTRAIN_FAULT_JOB=" + tag).encode()
    rank_kv = ("PMI_RANK=%d" % rank).encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/comm" % d, "rb") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if want in env and rank_kv in env and not comm.startswith(b"hydra"):
            pids.append(int(d))
    return pids


def cpu_seconds(pid):
    """User + system CPU seconds used so far by process `pid` (None once it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Job:
    """An mpiexec job in its own session whose merged stdout/stderr is collected by a thread, so
    that a caller can wait for a line while the job runs."""

    def __init__(self, cmd, env):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
        self.lines = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.p.stdout:
            with self.lock:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def output(self):
        with self.lock:
            return "\n".join(self.lines)

    def wait_for_line(self, pattern, timeout):
        """The first output line matching `pattern`, or None after `timeout` s or once the job
        has ended without one."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                for line in self.lines:
                    if rx.search(line):
                        return line
            if self.p.poll() is not None:
                self.reader.join(2)
                with self.lock:
                    return next((l for l in self.lines if rx.search(l)), None)
            time.sleep(0.05)
        return None

    def wait(self, timeout):
        """(exit code, seconds since start); kills the whole session and returns code None when
        the job is still running after `timeout` s."""
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            self.reader.join(2)
            return None, time.monotonic() - self.t0
        self.reader.join(5)
        return self.p.returncode, time.monotonic() - self.t0

    def kill(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()
