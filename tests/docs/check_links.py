#!/usr/bin/env python3
"""docs_links: every relative link of the Markdown pages resolves, and every repository path that
a source comment names exists (python3, stdlib only).

  check_links.py SOURCE_DIR

Pages: README.md, docs/*.md, benchmarks/*.md and examples/**/*.md. A link [text](target) or a
reference definition [label]: target outside code blocks and code spans must name a file or
directory inside the repository (relative to the page; a leading / is the repository root), and a
#anchor into a .md page (or the page itself) must match one of its headings as GitHub makes
anchors of them. Links with a scheme (https:, mailto:) are not followed.

Comments: the // and /* */ comments of C++ sources and the # comments of CMake, shell and Python
files under include/ kernels/ transports/ tests/ benchmarks/ examples/ scripts/ cmake/. A word
there that looks like a relative path to a file (a/b.ext, ext one of EXTS) must name a file of
the repository: its path from the root, or the end of it after a '/' (so <dtrain/core/span.hpp>
and algo/shm.hpp both count); one starting with ./ or ../ must resolve from the file's directory.
A directory named from the root (tests/fuzz/regressions/) must exist. Absolute paths (system
files) and URLs are not checked.

Exit status 0 when everything resolves, 1 with one line per broken reference otherwise.
"""
import os
import re
import sys

SOURCE_DIRS = ("include", "kernels", "transports", "tests", "benchmarks", "examples", "scripts",
               "cmake")
CXX_EXTS = (".hpp", ".cuh", ".cpp", ".cu", ".h")
HASH_EXTS = (".cmake", ".sh", ".py")
EXTS = ("md", "hpp", "cuh", "cpp", "cu", "cmake", "sh", "py", "txt", "in", "supp", "json",
        "sbatch")
TOP_DIRS = ("include", "kernels", "transports", "tests", "benchmarks", "examples", "scripts",
            "cmake", "docs", ".ci")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
PATH = re.compile(r"(?<![\w./<>$@:-])((?:\.\.?/)*[A-Za-z0-9_][\w.+-]*(?:/[\w.+-]+)*/?)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def slug(heading):
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces to
    hyphens."""
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    t = re.sub(r"<[^>]+>", "", t)
    t = t.replace("`", "").replace("*", "").strip().lower()
    t = "".join(c for c in t if c.isalnum() or c in " -_")
    return t.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, counts, in_code = set(), {}, None
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = FENCE.match(line)
                if m:
                    in_code = None if in_code and m.group(1)[0] == in_code else \
                        (in_code or m.group(1)[0])
                    continue
                if in_code:
                    continue
                h = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
                if h:
                    s = slug(h.group(1))
                    n = counts.get(s, 0)
                    counts[s] = n + 1
                    found.add(s if n == 0 else f"{s}-{n}")
                for a in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
                    found.add(a)
        cache[path] = found
    return cache[path]


def inside(root, path):
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def md_pages(root):
    out = [os.path.join(root, "README.md")]
    for d in ("docs", "benchmarks"):
        full = os.path.join(root, d)
        if os.path.isdir(full):
            out += [os.path.join(full, n) for n in sorted(os.listdir(full)) if n.endswith(".md")]
    for dirpath, dirs, files in os.walk(os.path.join(root, "examples")):
        dirs.sort()
        out += [os.path.join(dirpath, n) for n in sorted(files) if n.endswith(".md")]
    return [p for p in out if os.path.isfile(p)]


def check_page(root, page, errors):
    rel = os.path.relpath(page, root)
    in_code = None
    with open(page, encoding="utf-8") as f:
        lines = f.readlines()
    for no, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m:
            in_code = None if in_code and m.group(1)[0] == in_code else (in_code or m.group(1)[0])
            continue
        if in_code:
            continue
        text = re.sub(r"(`+).*?\1", "", line)  # code spans are not links
        targets = LINK.findall(text)
        d = REFDEF.match(text)
        if d:
            targets.append(d.group(1))
        for target in targets:
            if not target or SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            if path.startswith("/"):
                full = os.path.join(root, path.lstrip("/"))
            elif path:
                full = os.path.join(os.path.dirname(page), path)
            else:
                full = page
            full = os.path.normpath(full)
            if not inside(root, full):
                errors.append(f"{rel}:{no}: link '{target}' leaves the repository")
            elif not os.path.exists(full):
                errors.append(f"{rel}:{no}: link '{target}': {os.path.relpath(full, root)} "
                              "does not exist")
            elif anchor and full.endswith(".md") and os.path.isfile(full):
                if anchor not in anchors(full):
                    errors.append(f"{rel}:{no}: link '{target}': no heading "
                                  f"'#{anchor}' in {os.path.relpath(full, root)}")


def cxx_comments(text):
    """(line, comment text) of every // and /* */ comment, string and character literals
    skipped."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end
            line += text.count("\n", i, end)
            i = end + len(m.group(1)) + 2
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
                i += 1  # a digit separator (1'000), not a character literal
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def hash_comments(text):
    """(line, comment text) of every # comment outside a quoted string (CMake, shell, Python)."""
    out = []
    for no, line in enumerate(text.split("\n"), 1):
        quote = None
        for k, c in enumerate(line):
            if quote:
                if c == "\\":
                    continue
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or line[k - 1] in " \t;("):
                out.append((no, line[k + 1:]))
                break
    return out


def source_files(root):
    for top in SOURCE_DIRS:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d not in ("corpus", "regressions"))
            for name in sorted(files):
                full = os.path.join(dirpath, name)
                if name.endswith(CXX_EXTS):
                    yield full, "cxx"
                elif name.endswith(HASH_EXTS) or name == "CMakeLists.txt":
                    yield full, "hash"
                elif "." not in name and top == "scripts":
                    yield full, "hash"  # the scripts/ commands (bash)


def repository_files(root):
    """Every file's path from the root ('/'-separated), build trees and .git left out."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        if dirpath == root:
            dirs[:] = [d for d in dirs if not d.startswith("build") and d != ".git"]
        out += [os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/")
                for n in files]
    return out


def resolves(root, source, cand, files):
    if cand.startswith(("./", "../")):
        full = os.path.normpath(os.path.join(os.path.dirname(source), cand))
        return inside(root, full) and os.path.exists(full)
    cand = os.path.normpath(cand).replace(os.sep, "/")
    return any(f == cand or f.endswith("/" + cand) for f in files)


def check_comments(root, errors):
    files = repository_files(root)
    for path, kind in source_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        comments = cxx_comments(text) if kind == "cxx" else hash_comments(text)
        rel = os.path.relpath(path, root)
        for no, comment in comments:
            for cand in PATH.findall(comment):
                cand = cand.rstrip(".")
                if "/" not in cand.rstrip("/"):
                    continue
                if cand.endswith("/"):
                    first = cand.lstrip("./").split("/")[0]
                    if first not in TOP_DIRS or cand.startswith("."):
                        continue
                    if not os.path.isdir(os.path.join(root, cand)):
                        errors.append(f"{rel}:{no}: the comment names {cand}, which does not exist")
                    continue
                ext = cand.rsplit(".", 1)[-1] if "." in cand.rsplit("/", 1)[-1] else ""
                if ext not in EXTS:
                    continue
                if not resolves(root, path, cand, files):
                    errors.append(f"{rel}:{no}: the comment names {cand}, which does not exist")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = os.path.realpath(sys.argv[1])
    errors = []
    pages = md_pages(root)
    for page in pages:
        check_page(root, page, errors)
    check_comments(root, errors)
    for e in errors:
        print(e)
    print(f"docs_links: {len(pages)} pages and the source comments checked: "
          f"{len(errors)} broken reference(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
