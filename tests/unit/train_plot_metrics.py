#!/usr/bin/python3
"""scripts/plot-metrics on a real metrics.csv, its PNG checked independently (standard library).

  train_plot_metrics.py SCRIPT CSV WORKDIR

CSV is tests/unit/train_plot_metrics.csv, the metrics.csv of a real run of example 10 (2 epochs
on 2 ranks, --log-every 50: 19 interval rows with loss, 2 epoch rows with accuracies; written on
2026-12-06 by `mpiexec.mpich -n 2 train_fashion_mnist --data fashion_mnist.h5 --epochs 2
--log-every 50 --run-dir RUN`). Checked:
  - the default plot (loss, train and test accuracy) is a valid PNG: signature, IHDR first, every
    chunk's CRC, IDAT's zlib stream inflating to exactly the filtered rows IHDR promises, IEND
    last; the rows unfilter to an image of several colours, and the file is not a trivial one;
  - the interval rows alone (no accuracy yet): the empty columns are left out, with a note;
  - a named column the file lacks, and a file without rows, fail with a message;
  - without gnuplot on PATH the script fails and says that gnuplot is missing.
Exits 77 (skipped) when gnuplot is not installed, after the last check, which needs none."""
import os
import shutil
import struct
import subprocess
import sys
import zlib

FAILURES = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))
    if not ok:
        FAILURES.append(name)


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    return p.returncode, p.stdout + p.stderr


def unfilter(raw, height, stride, bpp):
    """The rows of a non-interlaced image, PNG filters (None, Sub, Up, Average, Paeth) undone."""
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        kind, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + ((a + b) >> 1)) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 255
            elif kind != 0:
                raise ValueError(f"unknown filter type {kind}")
        rows.append(bytes(line))
        prev = line
    return rows


def png_problems(path, min_bytes=8000, min_colours=3):
    """What is wrong with the PNG file at `path` ([] when nothing), and a short description."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        return [f"unreadable: {e}"], ""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return ["no PNG signature"], ""
    chunks, pos = [], 8
    while pos < len(data):
        if pos + 12 > len(data):
            return ["truncated chunk"], ""
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            return [f"chunk {kind!r}: CRC mismatch"], ""
        chunks.append((kind, body))
        pos += 12 + length
        if kind == b"IEND":
            break
    problems = []
    if not chunks or chunks[0][0] != b"IHDR" or len(chunks[0][1]) != 13:
        return ["the first chunk is not a 13-byte IHDR"], ""
    if chunks[-1][0] != b"IEND" or pos != len(data):
        problems.append("IEND is not the last chunk")
    width, height, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour)
    if width == 0 or height == 0 or channels is None or comp != 0 or filt != 0 or interlace != 0:
        return problems + [f"unexpected IHDR {width}x{height} depth {depth} colour {colour} "
                           f"interlace {interlace}"], ""
    try:
        raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    except zlib.error as e:
        return problems + [f"IDAT does not inflate: {e}"], ""
    stride = (width * channels * depth + 7) // 8
    if len(raw) != height * (1 + stride):
        return problems + [f"IDAT inflates to {len(raw)} bytes, IHDR needs {height * (1 + stride)}"], ""
    bpp = max(1, channels * depth // 8)
    rows = unfilter(raw, height, stride, bpp)
    colours = {row[x:x + bpp] for row in rows for x in range(0, stride - bpp + 1, bpp)}
    if len(colours) < min_colours:
        problems.append(f"only {len(colours)} distinct colours: a blank image")
    if len(data) < min_bytes:
        problems.append(f"{len(data)} bytes: smaller than any real plot ({min_bytes})")
    return problems, f"{width}x{height}, {len(data)} bytes, {len(colours)} colours"


def main():
    script, csv, work = sys.argv[1], sys.argv[2], sys.argv[3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    have_gnuplot = shutil.which("gnuplot") is not None
    with open(csv) as f:
        lines = f.read().splitlines()
    header, rows = lines[0], lines[1:]
    check("the committed CSV is a real run's", header.split(",")[:3] == ["step", "epoch", "loss"]
          and len(rows) > 10 and any(r.endswith(",,,,,") for r in rows))

    if have_gnuplot:
        png = os.path.join(work, "metrics.png")
        rc, out = run([script, csv, png])
        problems, about = png_problems(png)
        check("loss and accuracies drawn", rc == 0 and not problems and "left out" not in out,
              f"rc {rc}, {about} {problems} {out.strip()}")

        interval = os.path.join(work, "interval.csv")
        with open(interval, "w") as f:
            f.write("\n".join([header] + [r for r in rows if not r.endswith(",,,,,")]) + "\n")
        png2 = os.path.join(work, "interval.png")
        rc, out = run([script, "--title", "interval rows only", interval, png2])
        problems, about = png_problems(png2)
        check("columns without values left out", rc == 0 and not problems and
              "'train_accuracy' has no values yet" in out and "'test_accuracy'" in out,
              f"rc {rc}, {about} {problems} {out.strip()}")

        rc, out = run([script, csv, os.path.join(work, "x.png"), "loss", "no_such_column"])
        check("a missing column is an error", rc != 0 and "no column 'no_such_column'" in out,
              out.strip())

        empty = os.path.join(work, "empty.csv")
        with open(empty, "w") as f:
            f.write(header + "\n")
        rc, out = run([script, empty, os.path.join(work, "empty.png")])
        check("nothing to draw is an error", rc != 0 and "nothing to draw" in out and
              not os.path.exists(os.path.join(work, "empty.png")), out.strip())

    # A PATH with the tools the script uses, but no gnuplot.
    bin_dir = os.path.join(work, "bin")
    os.makedirs(bin_dir)
    for tool in ("bash", "head", "tr", "awk", "sed", "mv", "rm"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, os.path.join(bin_dir, tool))
    env = dict(os.environ, PATH=bin_dir)
    rc, out = run([script, csv, os.path.join(work, "none.png")], env=env)
    check("without gnuplot it fails and says so", rc != 0 and "gnuplot is not installed" in out,
          out.strip())

    if FAILURES:
        print("FAILED:", ", ".join(FAILURES))
        return 1
    if not have_gnuplot:
        print("SKIPPED: gnuplot is not installed (Debian: apt-get install gnuplot-nox)")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
