#!/usr/bin/python3
"""Bad input to convert_idx_to_hdf5 is an error with a message, never a result: each case builds a
small IDX source folder, runs the converter, and requires exit code 1 (2 for bad options), the
expected words in its message, and neither FILE nor FILE.tmp left behind."""
import gzip
import os
import struct
import subprocess
import sys
import tempfile


def idx(dims, payload, code=0x08):
    return struct.pack(">HBB", 0, code, len(dims)) + struct.pack(">" + "I" * len(dims), *dims) + payload


def write_set(d, stem, n, labels=None, image_dims=None, gz=True, image_payload=None):
    labels = labels if labels is not None else [i % 10 for i in range(n)]
    dims = image_dims or [n, 28, 28]
    images = idx(dims, image_payload if image_payload is not None else bytes(n * 784))
    lab = idx([len(labels)], bytes(labels))
    for name, blob in ((stem + "-images-idx3-ubyte", images), (stem + "-labels-idx1-ubyte", lab)):
        if gz:
            with gzip.open(os.path.join(d, name + ".gz"), "wb") as f:
                f.write(blob)
        else:
            with open(os.path.join(d, name), "wb") as f:
                f.write(blob)


def run(exe, src, out, extra=()):
    p = subprocess.run([exe, "--src", src, "--out", out, *extra], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    exe = sys.argv[1]
    failures = []

    def case(name, setup, expect_rc, words, extra=()):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "src")
            os.mkdir(src)
            setup(src)
            out = os.path.join(d, "out.h5")
            rc, text = run(exe, src, out, extra)
            left = [p for p in (out, out + ".tmp") if os.path.exists(p)]
            ok = rc == expect_rc and all(w in text for w in words) and not left and \
                "bad_alloc" not in text
            print(f"{'ok  ' if ok else 'FAIL'} {name}: rc {rc}, left {left}\n     {text.strip()[:300]}")
            if not ok:
                failures.append(name)

    def absurd(src):
        write_set(src, "train", 20)
        write_set(src, "t10k", 10)
        # A gzip image file whose header claims 4294967295 samples of 28 x 28.
        with gzip.open(os.path.join(src, "t10k-images-idx3-ubyte.gz"), "wb") as f:
            f.write(idx([0xFFFFFFFF, 28, 28], bytes(10 * 784)))

    def bad_test_label(src):
        write_set(src, "train", 20)
        write_set(src, "t10k", 10, labels=[0, 1, 2, 3, 4, 5, 10, 7, 8, 9])

    def bad_train_label(src):
        write_set(src, "train", 20, labels=[3] * 19 + [200], gz=False)
        write_set(src, "t10k", 10)

    def truncated(src):
        write_set(src, "train", 20, image_payload=bytes(20 * 784 - 5), gz=False)
        write_set(src, "t10k", 10)

    case("absurd header count (gzip)", absurd, 1, ["declares", "4294967295", "t10k-images"])
    case("test label out of range", bad_test_label, 1, ["label 10", "sample 6", "t10k-labels"])
    case("train label out of range", bad_train_label, 1, ["label 200", "sample 19"])
    case("truncated plain file", truncated, 1, ["train-images"])
    case("non-numeric --chunk", lambda s: (write_set(s, "train", 20), write_set(s, "t10k", 10)), 2,
         ["--chunk", "64abc"], ("--chunk", "64abc"))
    case("--gzip out of range", lambda s: (write_set(s, "train", 20), write_set(s, "t10k", 10)), 2,
         ["--gzip"], ("--chunk", "10", "--gzip", "12"))
    if failures:
        print("FAILED:", ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
