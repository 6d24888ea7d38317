#!/usr/bin/env python3
"""The runnable snippets of README.md and the guide pages under docs/ (python3, stdlib only).

The convention (tests/docs/CMakeLists.txt): the FIRST fenced block whose
info string is `cpp` on a page is a complete C++17 program with `int main`, whose first line is

    // docs-snippet: <components> [np=N]

<components> are dtrain CMake components (core loopback mpi hdf5 blas ibverbs cuda hip config). Without
np the program is only compiled; with np=N it is also built and run (under mpiexec -n N when
`mpi` is listed, else directly) and must exit with status 0. A guide page (every docs/*.md but
the reference pages in NOT_GUIDE_PAGES) must have such a block, near its top; README.md too.

  snippets.py list --root SRC --out FILE.cmake     (configure time: what CMake registers)
  snippets.py test --config CONFIG.txt --page FILE --name NAME --workdir DIR   (one CTest)

`test` exits 0 when the snippet compiled (and ran), 77 when a component or compiler it needs is
not available here (a skip, never a pass), 1 otherwise.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

COMPONENTS = ("core", "loopback", "mpi", "hdf5", "blas", "ibverbs", "cuda", "hip", "config")
GPU_COMPONENTS = ("cuda", "hip")
# Pages under docs/ that are references (formats, measurement notes), not guide pages: they need
# no snippet, and are compiled only if they have a `cpp` block that carries a docs-snippet header.
NOT_GUIDE_PAGES = {"checkpoint-format.md", "benchmark-notes.md"}
# A guide page's snippet follows its title and at most a short introduction.
MAX_INTRO_LINES = 4
HEADER = re.compile(r"^//\s*docs-snippet:\s*(.*?)\s*$")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([^`\s]*)\s*$")


class SnippetError(Exception):
    pass


# Tests of tests/docs/CMakeLists.txt whose names a page's test must not take.
CHECK_TESTS = ("docs_links", "docs_reference")


def test_name(page_path):
    """docs_<page>: README.md -> docs_readme, docs/training-loop.md -> docs_training_loop, and
    docs/reference.md -> docs_reference_page (docs_reference is the completeness check)."""
    stem = os.path.splitext(os.path.basename(page_path))[0].lower()
    name = "docs_" + re.sub(r"[^a-z0-9]+", "_", stem).strip("_")
    return name + "_page" if name in CHECK_TESTS else name


def pages(root):
    """(path, is_guide) for README.md and every docs/*.md, sorted."""
    out = []
    readme = os.path.join(root, "README.md")
    if os.path.exists(readme):
        out.append((readme, True))
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        for name in sorted(os.listdir(docs)):
            if name.endswith(".md"):
                out.append((os.path.join(docs, name), name not in NOT_GUIDE_PAGES))
    return out


def first_cpp_block(text):
    """(start line (1-based) of the opening fence, lines of the block) of the first `cpp` block,
    or None."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            fence, info = m.group(1), m.group(2)
            j = i + 1
            while j < len(lines):
                c = FENCE.match(lines[j])
                closes = c and c.group(1)[0] == fence[0] and len(c.group(1)) >= len(fence)
                if closes and not c.group(2):
                    break
                j += 1
            if info == "cpp":
                return i + 1, lines[i + 1:j]
            i = j + 1
            continue
        i += 1
    return None


def parse_page(path, is_guide):
    """The page's snippet as a dict (components, np, code, line), or None for a reference page
    without one. Raises SnippetError naming what is wrong."""
    rel = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    block = first_cpp_block(text)
    if block is None:
        if is_guide:
            raise SnippetError(f"{rel} has no ```cpp block: a guide page starts with a runnable "
                               "snippet (// docs-snippet: <components> [np=N])")
        return None
    line, code = block
    if not code or not HEADER.match(code[0]):
        if not is_guide:
            return None
        found = code[0] if code else ""
        raise SnippetError(f"{rel}:{line + 1}: the first ```cpp block must begin with "
                           f"'// docs-snippet: <components> [np=N]', found '{found}'")
    words = HEADER.match(code[0]).group(1).split()
    comps, np = [], 0
    for w in words:
        if w.startswith("np="):
            if not re.fullmatch(r"np=[1-9][0-9]?", w):
                raise SnippetError(f"{rel}:{line + 1}: '{w}' is not np=N with N in 1..99")
            np = int(w[3:])
        elif w in COMPONENTS:
            if w not in comps:
                comps.append(w)
        else:
            raise SnippetError(f"{rel}:{line + 1}: unknown component '{w}' (known: "
                               f"{' '.join(COMPONENTS)})")
    if not comps:
        raise SnippetError(f"{rel}:{line + 1}: the docs-snippet header lists no component")
    body = "\n".join(code) + "\n"
    if not re.search(r"\bint\s+main\s*\(", body):
        raise SnippetError(f"{rel}:{line}: the first ```cpp block is not a complete program "
                           "(no int main)")
    if is_guide and os.path.basename(path) != "README.md":
        # Title, then at most a short introduction: the snippet is what a reader sees first.
        before = [l for l in text.splitlines()[:line - 1] if l.strip()]
        if len(before) > 1 + MAX_INTRO_LINES:
            raise SnippetError(f"{rel}:{line}: the snippet comes after {len(before) - 1} lines of "
                               f"text; a guide page starts with it (at most {MAX_INTRO_LINES} "
                               "lines between the title and the snippet)")
    return {"components": comps, "np": np, "code": body, "line": line}


def cmd_list(args):
    """Writes a CMake file: DOCS_PAGES, and per page DOCS_<name>_{FILE,NP,MPI,ERROR}."""
    out = ["# Written by tests/docs/snippets.py list: the pages whose snippets are tested."]
    names = []
    for path, is_guide in pages(args.root):
        name = test_name(path)
        try:
            snip = parse_page(path, is_guide)
            if snip is None:
                continue
            np, mpi, error = snip["np"], "mpi" in snip["components"], ""
        except SnippetError as e:
            np, mpi, error = 0, False, str(e)
        names.append(name)
        esc = lambda s: s.replace("\\", "/").replace('"', "'").replace("$", "")
        out.append(f'set(DOCS_{name}_FILE "{esc(path)}")')
        out.append(f"set(DOCS_{name}_NP {np})")
        out.append(f"set(DOCS_{name}_MPI {'ON' if mpi else 'OFF'})")
        out.append(f'set(DOCS_{name}_ERROR "{esc(error)}")')
    out.append(f"set(DOCS_PAGES {';'.join(names)})")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return 0


def run(cmd, cwd, timeout, env=None):
    print("+ " + " ".join(cmd), flush=True)
    t = time.time()
    try:
        p = subprocess.run(cmd, cwd=cwd, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"docs snippet: timed out after {timeout} s", flush=True)
        return 124
    print(f"  ({time.time() - t:.1f} s, exit {p.returncode})", flush=True)
    return p.returncode


def load_config(path):
    """The driver's configuration, written by tests/docs/CMakeLists.txt: one "key<TAB>value" per
    line, lists separated by ';'."""
    raw = {}
    comps = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("\t")
            if key == "component":
                comps.append(value)
            else:
                raw[key] = value
    items = lambda k: [x for x in raw.get(k, "").split(";") if x]
    cfg = {"source_dir": raw["source_dir"], "cxx": raw["cxx"], "cxx_flags": items("cxx_flags"),
           "run_flags": items("run_flags"), "mpiexec": raw.get("mpiexec", ""),
           "mpiexec_np_flag": raw.get("mpiexec_np_flag") or "-n",
           "mpiexec_pre": items("mpiexec_pre"), "components": {}, "gpu": {}}
    for c in comps:
        cfg["components"][c] = {"flags": items(c + ".flags"), "libs": items(c + ".libs")}
    for g in GPU_COMPONENTS:
        if raw.get(g + ".compiler"):
            env = {"TMPDIR": raw[g + ".tmpdir"]} if raw.get(g + ".tmpdir") else {}
            cfg["gpu"][g] = {"compiler": raw[g + ".compiler"], "flags": items(g + ".flags"),
                             "env": env}
    return cfg


def cmd_test(args):
    cfg = load_config(args.config)
    page = args.page
    is_guide = os.path.basename(page) == "README.md" or \
        os.path.basename(page) not in NOT_GUIDE_PAGES
    try:
        snip = parse_page(page, is_guide)
    except SnippetError as e:
        print(f"docs snippet: {e}")
        return 1
    if snip is None:
        print(f"docs snippet: {page} has no snippet to test")
        return 1
    comps = snip["components"]
    print(f"docs snippet: {os.path.relpath(page, cfg['source_dir'])} line {snip['line']}: "
          f"components {' '.join(comps)}" + (f", run on {snip['np']} rank(s)" if snip["np"] else
                                             ", compile only"))
    missing = [c for c in comps if c not in GPU_COMPONENTS and c not in cfg["components"]]
    if missing:
        print("docs snippet: SKIPPED: this build has no " +
              ", ".join(f"dtrain::{c}" for c in missing) + " (its dependency was not found)")
        return 77
    if os.path.isdir(args.workdir):
        shutil.rmtree(args.workdir)
    os.makedirs(args.workdir)
    src = os.path.join(args.workdir, args.name + ".cpp")
    with open(src, "w", encoding="utf-8") as f:
        # Diagnostics name the page and its line.
        rel = os.path.relpath(page, cfg["source_dir"])
        f.write(f'#line {snip["line"] + 1} "{rel}"\n' + snip["code"])

    host = [c for c in comps if c not in GPU_COMPONENTS]
    flags, libs = [], []
    for c in ["core"] + host:
        for x in cfg["components"][c]["flags"]:
            if x not in flags:
                flags.append(x)
        for x in cfg["components"][c]["libs"]:
            if x not in libs:
                libs.append(x)

    gpus = [c for c in comps if c in GPU_COMPONENTS]
    if gpus:
        # A device snippet is compiled by the vendor compiler of each dialect it lists.
        found = [g for g in gpus if cfg["gpu"].get(g)]
        absent = [g for g in gpus if not cfg["gpu"].get(g)]
        if not found:
            print("docs snippet: SKIPPED: " + " and ".join(
                {"cuda": "nvcc", "hip": "hipcc"}[g] for g in absent) +
                " not found, so the " + "/".join(g.upper() for g in absent) +
                " compile of this snippet did not run")
            return 77
        for g in absent:
            print(f"docs snippet: {'nvcc' if g == 'cuda' else 'hipcc'} not found: the "
                  f"{g.upper()} compile was not checked")
        includes_defs = [x for x in flags if x.startswith(("-I", "-D", "-isystem"))]
        for g in found:
            gc = cfg["gpu"][g]
            out = os.path.join(args.workdir, f"{args.name}_{g}.out")
            env = dict(os.environ)
            env.update(gc["env"])
            cmd = [gc["compiler"]] + gc["flags"] + includes_defs + [src, "-o", out]
            rc = run(cmd, args.workdir, args.timeout, env)
            if rc != 0:
                print(f"docs snippet: FAILED: {g.upper()} compile of {page}")
                return 1
        if snip["np"]:
            print("docs snippet: np is not run for device snippets (compile only)")
        return 0

    if not snip["np"]:
        rc = run([cfg["cxx"]] + cfg["cxx_flags"] + flags + ["-fsyntax-only", src], args.workdir,
                 args.timeout)
        if rc != 0:
            print(f"docs snippet: FAILED: compile of {page}")
            return 1
        return 0
    exe = os.path.join(args.workdir, args.name)
    rc = run([cfg["cxx"]] + cfg["cxx_flags"] + cfg["run_flags"] + flags + [src, "-o", exe] + libs,
             args.workdir, args.timeout)
    if rc != 0:
        print(f"docs snippet: FAILED: build of {page}")
        return 1
    if "mpi" in comps:
        cmd = [cfg["mpiexec"], cfg["mpiexec_np_flag"], str(snip["np"])] + cfg["mpiexec_pre"] + [exe]
    elif snip["np"] == 1:
        cmd = [exe]
    else:
        print(f"docs snippet: np={snip['np']} needs the mpi component (without it the program "
              "runs as one process: np=1)")
        return 1
    rc = run(cmd, args.workdir, args.run_timeout)
    if rc == 77:
        print("docs snippet: SKIPPED: the program itself exited 77 (what it needs is missing here)")
        return 77
    if rc != 0:
        print(f"docs snippet: FAILED: the program of {page} exited with {rc}")
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("list")
    a.add_argument("--root", required=True)
    a.add_argument("--out", required=True)
    b = sub.add_parser("test")
    b.add_argument("--config", required=True)
    b.add_argument("--page", required=True)
    b.add_argument("--name", required=True)
    b.add_argument("--workdir", required=True)
    b.add_argument("--timeout", type=int, default=240)
    b.add_argument("--run-timeout", type=int, default=60)
    args = ap.parse_args()
    return cmd_list(args) if args.cmd == "list" else cmd_test(args)


if __name__ == "__main__":
    sys.exit(main())
