#!/usr/bin/python3
"""Independent check of convert_idx_to_hdf5's output with h5py and Python's gzip module:
shapes, dtypes, attributes, and every byte against the IDX sources. Exit 0 when all agree,
77 when h5py/numpy are missing."""
import gzip
import os
import struct
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"SKIPPED: {e} (Debian: apt-get install python3-h5py)")
    sys.exit(77)


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    assert zero == 0 and code == 0x08, f"{path}: unexpected IDX header"
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data[4 + 4 * ndim:], dtype=np.uint8).reshape(dims)


def main():
    out, src = sys.argv[1], sys.argv[2]
    if not os.path.exists(out):
        print(f"SKIPPED: {out} was not produced (source data missing?)")
        return 77
    with h5py.File(out, "r") as f:
        assert f.attrs["format"] in (b"dtrain-dataset", "dtrain-dataset")
        for group, stem, n in (("train", "train", 60000), ("test", "t10k", 10000)):
            images, labels = f[group + "/images"], f[group + "/labels"]
            assert images.shape == (n, 28, 28) and images.dtype == np.uint8, images
            assert labels.shape == (n,) and labels.dtype == np.uint8, labels
            assert int(labels.attrs["num_classes"]) == 10
            assert len(labels.attrs["class_names"]) == 10
            ref_images = read_idx(os.path.join(src, stem + "-images-idx3-ubyte.gz"))
            ref_labels = read_idx(os.path.join(src, stem + "-labels-idx1-ubyte.gz"))
            assert np.array_equal(images[...], ref_images), group + "/images differ"
            assert np.array_equal(labels[...], ref_labels), group + "/labels differ"
            mean = ref_images.astype(np.float64).mean() / 255.0
            assert abs(float(images.attrs["mean"]) - mean) < 1e-9, "mean attribute"
            print(f"{group}: {n} samples identical to the IDX files, mean {mean:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
