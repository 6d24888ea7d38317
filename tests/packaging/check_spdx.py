#!/usr/bin/env python3
"""Every installed header (include/, transports/, kernels/) and every header the examples share
starts with the project's SPDX line, and LICENSE holds the license that line names.

usage: check_spdx.py SOURCE_DIR
"""
import pathlib
import sys

SPDX = "// SPDX-License-Identifier: BSD-3-Clause"
ROOTS = ("include", "transports", "kernels", "examples/common")
SUFFIXES = (".hpp", ".cuh", ".h")


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    problems = []
    license_text = (root / "LICENSE").read_text(encoding="utf-8") if (root / "LICENSE").exists() else ""
    if "Redistribution and use in source and binary forms" not in license_text or \
            "Neither the name of the copyright holder" not in license_text:
        problems.append("LICENSE: not the BSD-3-Clause text the SPDX lines name")
    count = 0
    for top in ROOTS:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            count += 1
            with path.open(encoding="utf-8") as f:
                first = f.readline().rstrip("\n")
            if first != SPDX:
                problems.append(f"{path.relative_to(root)}: first line is {first!r}, not {SPDX!r}")
    for p in problems:
        print(p)
    if count == 0:
        print("no headers found under", ", ".join(ROOTS))
        return 1
    print(f"check_spdx: {count} headers checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
