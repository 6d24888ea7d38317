#!/usr/bin/env python3
"""docs_reference: docs/reference.md lists every setting the code has (python3, stdlib only).

  check_reference.py SOURCE_DIR

Checked, each against a table row of docs/reference.md whose first cell names it in backticks:
  - every environment variable the library reads: each "DTRAIN_*" string literal in the code of
    include/ kernels/ transports/, and any other name given to getenv or env::get* there;
  - every DTRAIN_* CMake option and cache variable of CMakeLists.txt and cmake/*.cmake (option(),
    set(... CACHE <type>) other than INTERNAL, find_program/find_path/find_library/find_file),
    with ${var} in a name expanded over the enclosing foreach;
  - every field of the public option structs (struct *Options / *Config outside detail/ folders
    of include/ transports/ kernels/), in the table under a heading that names the struct.
And the other way round: every DTRAIN_* name in a table row of reference.md occurs somewhere in
the repository's code, scripts or CMake files (a variable documented before it exists, or after
it was removed, fails too).

Exit status 0 when everything is listed, 1 with one line per omission otherwise.
"""
import os
import re
import sys

LIB_DIRS = ("include", "kernels", "transports")
CXX_EXTS = (".hpp", ".cuh", ".cpp", ".h")


def strip_comments(text):
    """C++ text without comments (string literals kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            if q == "'" and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
                out.append(q)
                i += 1
                continue
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def library_sources(root):
    for top in LIB_DIRS:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(CXX_EXTS):
                    yield os.path.join(dirpath, name)


def environment_variables(root):
    """{name: first file that reads it}."""
    found = {}
    getter = re.compile(r"\b(?:getenv|secure_getenv|env::get(?:_bool|_int|_double|_choice)?)"
                        r"\s*\(\s*\"([A-Za-z_][A-Za-z0-9_]*)\"")
    literal = re.compile(r"\"(DTRAIN_[A-Z0-9_]*[A-Z0-9])\"")
    for path in library_sources(root):
        with open(path, encoding="utf-8") as f:
            code = strip_comments(f.read())
        for name in getter.findall(code) + literal.findall(code):
            found.setdefault(name, os.path.relpath(path, root))
    return found


def cmake_variables(root):
    """{name: file} of the DTRAIN_* options and cache variables."""
    files = [os.path.join(root, "CMakeLists.txt")]
    cm = os.path.join(root, "cmake")
    files += [os.path.join(cm, n) for n in sorted(os.listdir(cm)) if n.endswith(".cmake")]
    found = {}
    decl = re.compile(
        r"\boption\(\s*(DTRAIN_[\w${}]+)"
        r"|\bset\(\s*(DTRAIN_[\w${}]+)\s[^)]*?\bCACHE\s+(\w+)"
        r"|\bfind_(?:program|path|library|file)\(\s*(DTRAIN_[\w${}]+)", re.I)
    loops = re.compile(r"\bforeach\(\s*(\w+)\s+(?:IN\s+ITEMS\s+)?([^)]*)\)", re.I)
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = "\n".join(l.split("#", 1)[0] if not l.lstrip().startswith("#") else ""
                             for l in f.read().split("\n"))
        for m in decl.finditer(text):
            if m.group(3) and m.group(3).upper() == "INTERNAL":
                continue
            name = m.group(1) or m.group(2) or m.group(4)
            names = [name]
            for var in re.findall(r"\$\{(\w+)\}", name):
                items = None
                for lm in loops.finditer(text, 0, m.start()):
                    if lm.group(1) == var:
                        items = lm.group(2).split()
                if items is None:
                    names = []
                    break
                names = [n.replace("${" + var + "}", it) for n in names for it in items]
            for n in names:
                found.setdefault(n, os.path.relpath(path, root))
    return found


def option_structs(root):
    """{struct: (file, [fields])} of the public *Options / *Config structs."""
    out = {}
    head = re.compile(r"^struct (\w+(?:Options|Config))\s*\{", re.M)
    for path in library_sources(root):
        if "/detail/" in path.replace(os.sep, "/"):
            continue
        with open(path, encoding="utf-8") as f:
            code = strip_comments(f.read())
        for m in head.finditer(code):
            depth, i, body_start = 1, m.end(), m.end()
            while i < len(code) and depth:
                depth += {"{": 1, "}": -1}.get(code[i], 0)
                i += 1
            body = code[body_start:i - 1]
            fields, level, stmt = [], 0, ""
            for k, c in enumerate(body):  # statements at the struct's own level
                if c == "{":
                    if level == 0:
                        stmt += c
                    level += 1
                    continue
                if c == "}":
                    level -= 1
                    if level == 0:
                        if body[k + 1:].lstrip().startswith((";", ",")):
                            stmt += c  # a brace initialiser
                        else:
                            stmt = ""  # a member function's body ends its statement
                    continue
                if level:
                    continue
                if c == ";":
                    s = " ".join(stmt.split())
                    stmt = ""
                    if not s or "(" in s.split("=")[0] or re.match(
                            r"(static|using|friend|enum|struct|class|template|public|private|"
                            r"protected)\b", s):
                        continue
                    for declarator in re.split(r",(?![^<]*>)", s):
                        dm = re.search(r"(\w+)\s*(?:=.*|\{.*\})?$", declarator.strip())
                        if dm:
                            fields.append(dm.group(1))
                else:
                    stmt += c
            out[m.group(1)] = (os.path.relpath(path, root), fields)
    return out


def table_names(lines):
    """Names in backticks in the first cell of each table row."""
    names = set()
    for line in lines:
        if line.lstrip().startswith("|"):
            cells = line.strip().strip("|").split("|")
            names.update(re.findall(r"`([^`]+)`", cells[0]))
    return names


def section(lines, struct):
    """The lines under the first heading that names `struct`, up to the next heading of the same
    or a higher level."""
    start, level = None, 0
    for i, line in enumerate(lines):
        h = re.match(r"^(#{1,6})\s+(.*)", line)
        if not h:
            continue
        if start is not None and len(h.group(1)) <= level:
            return lines[start:i]
        if start is None and re.search(r"\b" + struct + r"\b", h.group(2)):
            start, level = i + 1, len(h.group(1))
    return lines[start:] if start is not None else None


def repository_text(root):
    chunks = []
    for dirpath, dirs, files in os.walk(root):
        if dirpath == root:
            dirs[:] = [d for d in dirs if not d.startswith("build") and d not in (".git", "docs")]
        for n in files:
            if n.endswith(".md"):
                continue
            try:
                with open(os.path.join(dirpath, n), encoding="utf-8") as f:
                    chunks.append(f.read())
            except (UnicodeDecodeError, OSError):
                pass
    return "\n".join(chunks)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = os.path.realpath(sys.argv[1])
    ref = os.path.join(root, "docs", "reference.md")
    if not os.path.exists(ref):
        print("docs_reference: docs/reference.md does not exist")
        return 1
    with open(ref, encoding="utf-8") as f:
        lines = f.read().split("\n")
    listed = table_names(lines)
    errors = []
    env = environment_variables(root)
    for name, where in sorted(env.items()):
        if name not in listed:
            errors.append(f"environment variable {name} (read in {where}) is not in a table of "
                          "docs/reference.md")
    cmake = cmake_variables(root)
    for name, where in sorted(cmake.items()):
        if name not in listed:
            errors.append(f"CMake variable {name} ({where}) is not in a table of "
                          "docs/reference.md")
    structs = option_structs(root)
    for struct, (where, fields) in sorted(structs.items()):
        sec = section(lines, struct)
        if sec is None:
            errors.append(f"{struct} ({where}) has no section in docs/reference.md")
            continue
        have = table_names(sec)
        for field in fields:
            if field not in have:
                errors.append(f"{struct}::{field} ({where}) is not in the table under "
                              f"{struct}'s heading in docs/reference.md")
    text = repository_text(root)
    for name in sorted(n for n in listed if re.fullmatch(r"DTRAIN_[A-Z0-9_]+", n)):
        if not re.search(r"\b" + name + r"\b", text):
            errors.append(f"docs/reference.md lists {name}, which nothing in the repository uses")
    for e in errors:
        print(e)
    print(f"docs_reference: {len(env)} environment variables, {len(cmake)} CMake variables, "
          f"{sum(len(f) for _, f in structs.values())} fields of {len(structs)} option structs "
          f"checked: {len(errors)} missing")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
