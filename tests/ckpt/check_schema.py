#!/usr/bin/python3
"""Checks a dtrain checkpoint against docs/checkpoint-format.md using h5py only (no dtrain code):
root attributes, /config, one group per object, a dataset per tensor with its dtype and a crc32c
that this script recomputes with its own CRC32C, scalars as group attributes, /ranks/<r> groups.

usage: check_schema.py MAKE_SAMPLE_BINARY WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np


def crc32c(data: bytes) -> int:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283

STORED = {  # dtype attribute -> (HDF5 class, element size, little-endian bytes of the values)
    "f32": (h5py.h5t.FLOAT, 4, lambda a: a.astype("<f4").tobytes()),
    "f64": (h5py.h5t.FLOAT, 8, lambda a: a.astype("<f8").tobytes()),
    "f16": (h5py.h5t.FLOAT, 2, lambda a: a.astype("<f2").tobytes()),
    # h5py widens bfloat16 to float32 exactly; its bits are the upper half of the float32 bits.
    "bf16": (h5py.h5t.FLOAT, 2,
             lambda a: (a.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()),
    "i32": (h5py.h5t.INTEGER, 4, lambda a: a.astype("<i4").tobytes()),
    "i64": (h5py.h5t.INTEGER, 8, lambda a: a.astype("<i8").tobytes()),
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def main():
    binary, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    path = subprocess.run([binary, work], check=True, capture_output=True,
                          text=True).stdout.strip()
    check(os.path.basename(path) == "ckpt-000000000003.h5", "file name " + path)
    f = h5py.File(path, "r")

    a = f.attrs
    check(text(a["format"]) == "dtrain-checkpoint", "format attribute")
    check(int(a["format_version"]) == 1, "format_version")
    check(text(a["library_version"]).count(".") == 2, "library_version")
    check(int(a["step"]) == 3, "step")
    check(int(a["world_size"]) == 2, "world_size")
    check(float(a["created_unix"]) > 1.5e9, "created_unix")
    check(text(a["write_strategy"]) in ("rank0", "parallel_rank0", "parallel_slices"),
          "write_strategy")
    # The run's identity: the one its run directory holds; a file written there directly follows
    # itself.
    with open(os.path.join(os.path.dirname(path), "dtrain-run-id")) as idf:
        run_id = idf.read().strip()
    check(re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", run_id) is not None, "dtrain-run-id " + run_id)
    check(text(a["run_id"]) == run_id, "run_id")
    check(int(a["shared_step"]) == 3, "shared_step")
    cfg = f["config"]
    check(cfg.shape == () and text(cfg[()]) == '{"model": "fake", "lr": 0.01}', "config")
    check(int(cfg.attrs["crc32c"]) == crc32c(cfg[()]), "config crc32c")

    entries = 0
    datasets = {}

    def visit(name, obj):
        nonlocal entries
        if name == "config":
            return
        if isinstance(obj, h5py.Group):
            entries += len(obj.attrs)
            return
        entries += 1
        dt = text(obj.attrs["dtype"])
        check(dt in STORED, name + ": dtype attribute " + dt)
        cls, size, tobytes = STORED[dt]
        check(obj.id.get_type().get_class() == cls, name + ": HDF5 class")
        check(obj.id.get_type().get_size() == size, name + ": element size")
        check(obj.chunks is None, name + ": contiguous layout")
        values = obj[()]
        got = crc32c(tobytes(np.asarray(values)))
        check(got == int(obj.attrs["crc32c"]), "%s: crc32c %08x != %08x" %
              (name, got, int(obj.attrs["crc32c"])))
        datasets[name] = (obj.shape, dt)

    f.visititems(visit)
    check(entries == int(a["entry_count"]), "entry_count %d != %d" % (entries, int(a["entry_count"])))

    # The sample's objects, as the document describes them.
    expect = {
        "model/fc1/weight": ((6, 4), "f32"), "model/fc1/bias": ((6,), "f32"),
        "model/fc1/half_w": ((6, 2), "f16"), "model/fc1/bf_w": ((3, 6), "bf16"),
        "model/fc2/weight": ((3, 6), "f32"), "model/counts": ((2, 2, 2), "i32"),
        "model/ids": ((5,), "i64"), "model/scale": ((), "f64"), "model/empty": ((0, 4), "f32"),
        "optimizer/m/0": ((6, 4), "f32"), "optimizer/v/3": ((3,), "f32"),
    }
    for name, want in expect.items():
        check(datasets.get(name) == want, "%s: %s, expected %s" % (name, datasets.get(name), want))
    opt = f["optimizer"].attrs
    check(int(opt["steps"]) == 3, "optimizer@steps")
    check(isinstance(opt["lr"], (float, np.floating)), "optimizer@lr is a float")
    check(text(opt["name"]) == "fake-adam \u03b2", "optimizer@name (UTF-8)")
    check(set(f["dropout"].attrs.keys()) == {"seed", "stream", "position"}, "dropout attributes")
    check(int(f["schedule"].attrs["position"]) == 3, "schedule@position")
    for r in (0, 1):
        s = f["ranks/%d/sampler" % r].attrs
        check(int(s["cursor"]) == 3 and int(s["epoch"]) == 0, "ranks/%d/sampler cursor" % r)
        rng = f["ranks/%d/sampler/rng" % r].attrs
        check(int(rng["stream"]) == r, "ranks/%d/sampler/rng@stream" % r)

    f.close()
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("schema check FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("schema check passed: %d entries, %d datasets" % (entries, len(datasets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
