#!/usr/bin/env python3
"""Checks that dtrain's Spack recipe agrees with dtrain's CMake options.

The recipe (packaging/spack/packages/dtrain/package.py) is read with `ast`, never imported, so
Spack need not be installed. The CMake side is CMakeLists.txt and cmake/*.cmake, read with a
small tokenizer that expands foreach() loops, since the component options are declared as
DTRAIN_ENABLE_${comp} inside one.

Checked:
  * every boolean variant (the recipe's own, and +cuda / +rocm of the CudaPackage / ROCmPackage
    mixins) is mapped by define_from_variant() onto an option that exists in the CMake sources,
    and every DTRAIN_ENABLE_<COMPONENT> option of the CMake sources has such a variant;
  * every DTRAIN_* name cmake_args() passes exists in the CMake sources;
  * component options are given ON or OFF only: define_from_variant() of a boolean variant, or
    define() of a bool / "ON" / "OFF"; the string AUTO appears nowhere in cmake_args();
  * the GPU architecture variants feed DTRAIN_CUDA_ARCHS / DTRAIN_HIP_ARCHS;
  * DTRAIN_BUILD_{TESTS,EXAMPLES,BENCHMARKS} (ON by default at top level) are set, to False or
    to self.run_tests;
  * each of the recipe's own variants pulls in a dependency, and doctest is a test dependency
    only;
  * the newest version() equals project(dtrain VERSION ...).

--self-test also runs the checks on altered copies of the recipe and of CMakeLists.txt (a
renamed variant, a dropped mapping, AUTO, a new component, ...) and fails unless every one of
them is reported. Exit status: 0 all good, 1 a check failed, 2 the inputs could not be read.
"""

import argparse
import ast
import re
import sys
from pathlib import Path

# Variants the build-system mixins declare: boolean ones and the architecture lists.
MIXIN_BOOL_VARIANTS = {"CudaPackage": ["cuda"], "ROCmPackage": ["rocm"]}
MIXIN_ARCH_VARIANTS = {
    "CudaPackage": ("cuda_arch", "DTRAIN_CUDA_ARCHS"),
    "ROCmPackage": ("amdgpu_target", "DTRAIN_HIP_ARCHS"),
}
COMPONENT_OPTION = re.compile(r"^DTRAIN_ENABLE_[A-Z0-9_]+$")
BUILD_SWITCHES = ("DTRAIN_BUILD_TESTS", "DTRAIN_BUILD_EXAMPLES", "DTRAIN_BUILD_BENCHMARKS")
FIND_COMMANDS = ("find_program", "find_path", "find_library", "find_file")


class InputError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# CMake side


def _skip_comment(text, i):
    """i is at '#'; returns the index after the comment (line or bracket comment)."""
    m = re.compile(r"#\[(=*)\[").match(text, i)
    if m:
        end = text.find("]" + m.group(1) + "]", m.end())
        return len(text) if end < 0 else end + len(m.group(1)) + 2
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _command_args(text, i, where):
    """Arguments of a command whose '(' ends just before i: (list of str, index after ')')."""
    args, cur, depth, n = [], None, 1, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            if cur is not None:
                args.append(cur)
                cur = None
            i += 1
        elif c == "#":
            i = _skip_comment(text, i)
        elif c == '"':
            j, buf = i + 1, []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j : j + 2])
                    j += 2
                else:
                    buf.append(text[j])
                    j += 1
            if j >= n:
                raise InputError(f"{where}: unterminated quoted argument")
            cur = (cur or "") + "".join(buf)
            i = j + 1
        elif c == "[" and re.compile(r"\[=*\[").match(text, i):
            m = re.compile(r"\[(=*)\[").match(text, i)
            end = text.find("]" + m.group(1) + "]", m.end())
            if end < 0:
                raise InputError(f"{where}: unterminated bracket argument")
            cur = (cur or "") + text[m.end() : end]
            i = end + len(m.group(1)) + 2
        elif c == "(":
            depth += 1
            cur = (cur or "") + c
            i += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                if cur is not None:
                    args.append(cur)
                return args, i + 1
            cur = (cur or "") + c
            i += 1
        else:
            cur = (cur or "") + c
            i += 1
    raise InputError(f"{where}: unbalanced parentheses")


def cmake_commands(text, where):
    """Yields (command name in lower case, [arguments]) for every command in a CMake file."""
    ident = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(")
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            i = _skip_comment(text, i)
            continue
        m = ident.match(text, i)
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            args, i = _command_args(text, m.end(), where)
            yield m.group(1).lower(), args
            continue
        i += 1


def _expand(name, loops):
    """Expands ${var} of enclosing foreach() loops in name; [] when a loop's items are unknown."""
    names = [name]
    for var, items in reversed(loops):
        ref = "${" + var + "}"
        if not any(ref in x for x in names):
            continue
        if items is None:
            return []
        names = [x.replace(ref, item) for x in names for item in items]
    return [x for x in names if "${" not in x]


def scan_cmake(files):
    """files: {label: text}. Returns (cache variables {name: (label, how)}, project version)."""
    cache, version = {}, None
    for label, text in files.items():
        loops = []
        for cmd, args in cmake_commands(text, label):
            if cmd == "foreach" and args:
                if len(args) > 1 and args[1] == "IN":
                    items = args[3:] if len(args) > 2 and args[2] == "ITEMS" else None
                elif len(args) > 1 and args[1] == "RANGE":
                    items = None
                else:
                    items = args[1:]
                loops.append((args[0], items))
            elif cmd == "endforeach":
                if loops:
                    loops.pop()
            elif cmd == "project" and "VERSION" in args:
                k = args.index("VERSION")
                if k + 1 < len(args):
                    version = args[k + 1]
            else:
                how = None
                if cmd == "set" and len(args) > 2 and "CACHE" in args[1:]:
                    k = args.index("CACHE", 1)
                    how = "cache " + (args[k + 1] if k + 1 < len(args) else "?")
                elif cmd == "option" and args:
                    how = "option"
                elif cmd in FIND_COMMANDS and args:
                    how = cmd
                if how:
                    for name in _expand(args[0], loops):
                        cache.setdefault(name, (label, how))
    return cache, version


# ---------------------------------------------------------------------------------------------
# Recipe side


def _const(node):
    return node.value if isinstance(node, ast.Constant) else None


def _call_name(call):
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _kw(call, name):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _directives(body, when=""):
    """Class-level directive calls, with `with when(...)` blocks flattened: [(call, when)]."""
    out = []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            out.append((stmt.value, when))
        elif isinstance(stmt, ast.With):
            cond = when
            for item in stmt.items:
                ctx = item.context_expr
                if isinstance(ctx, ast.Call) and _call_name(ctx) == "when" and ctx.args:
                    cond = (cond + " " + str(_const(ctx.args[0]) or "")).strip()
            out.extend(_directives(stmt.body, cond))
    return out


def _is_run_tests(node):
    return isinstance(node, ast.Attribute) and node.attr == "run_tests"


def _version_key(text):
    parts = text.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


class Recipe:
    def __init__(self, text, where):
        try:
            tree = ast.parse(text, filename=where)
        except SyntaxError as e:
            raise InputError(f"{where}: not valid Python: {e}") from e
        classes = [
            n for n in tree.body
            if isinstance(n, ast.ClassDef)
            and any(isinstance(b, ast.Name) and b.id.endswith("Package") for b in n.bases)
        ]
        if len(classes) != 1:
            raise InputError(f"{where}: expected one package class, found {len(classes)}")
        cls = classes[0]
        self.where = where
        self.bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        self.variants = {}  # name -> (boolean?, line)
        self.versions = []
        self.depends = []  # (spec, when, type node, line)
        for call, when in _directives(cls.body):
            name = _call_name(call)
            first = _const(call.args[0]) if call.args else None
            if name == "variant" and isinstance(first, str):
                default = _kw(call, "default")
                boolean = (
                    _kw(call, "values") is None
                    and default is not None
                    and isinstance(_const(default), bool)
                )
                self.variants[first] = (boolean, call.lineno)
            elif name == "version" and isinstance(first, str):
                self.versions.append(first)
            elif name == "depends_on" and isinstance(first, str):
                w = _const(_kw(call, "when")) or ""
                self.depends.append((first, (when + " " + w).strip(), _kw(call, "type"), call.lineno))
        for base, names in MIXIN_BOOL_VARIANTS.items():
            if base in self.bases:
                for v in names:
                    self.variants.setdefault(v, (True, None))
        funcs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "cmake_args"]
        if not funcs:
            raise InputError(f"{where}: the package class has no cmake_args()")
        self.cmake_args = funcs[0]


# ---------------------------------------------------------------------------------------------
# The checks


def check(recipe_text, cmake_files, recipe_label="package.py"):
    """Returns the list of problems found (empty: recipe and CMake agree)."""
    recipe = Recipe(recipe_text, recipe_label)
    cache, project_version = scan_cmake(cmake_files)
    errors = []

    def err(line, msg):
        errors.append(f"{recipe_label}:{line}: {msg}" if line else f"{recipe_label}: {msg}")

    components = sorted(n for n, (_, how) in cache.items()
                        if COMPONENT_OPTION.match(n) and how.startswith("cache"))
    if not components:
        errors.append("no DTRAIN_ENABLE_* component option found in the CMake sources")

    if "CMakePackage" not in recipe.bases:
        err(None, "the package class does not derive from CMakePackage")

    # Every option cmake_args() sets, and how.
    from_variant = {}  # option -> (variant, line)
    defined = {}  # option -> (value node, line)
    for node in ast.walk(recipe.cmake_args):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.search(r"\bAUTO\b", node.value):
                err(node.lineno, f"cmake_args() passes {node.value!r}: a variant gives ON or "
                                 "OFF, never AUTO")
            m = re.match(r"^-D([A-Za-z0-9_]+)", node.value)
            if m and m.group(1).startswith("DTRAIN_"):
                defined.setdefault(m.group(1), (None, node.lineno))
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        if name not in ("define_from_variant", "define") or not node.args:
            continue
        option = _const(node.args[0])
        if not isinstance(option, str):
            err(node.lineno, f"{name}() with an option name that is not a string literal")
            continue
        if name == "define_from_variant":
            variant = _const(node.args[1]) if len(node.args) > 1 else option.lower()
            if not isinstance(variant, str):
                err(node.lineno, f"define_from_variant({option!r}, ...) with a variant name "
                                 "that is not a string literal")
                continue
            if option in from_variant or option in defined:
                err(node.lineno, f"{option} is set more than once")
            from_variant[option] = (variant, node.lineno)
        else:
            value = node.args[1] if len(node.args) > 1 else None
            if option in from_variant or option in defined:
                err(node.lineno, f"{option} is set more than once")
            defined[option] = (value, node.lineno)

    # Options named in cmake_args() exist in the CMake sources.
    for option, (_, line) in sorted({**defined, **from_variant}.items()):
        if option.startswith("DTRAIN_") and option not in cache:
            err(line, f"{option} is not an option or cache variable of CMakeLists.txt or "
                      "cmake/*.cmake")

    # Variants -> options: each mapping names a boolean variant the recipe has.
    mapped_variants = {}
    for option, (variant, line) in sorted(from_variant.items()):
        if variant not in recipe.variants:
            err(line, f"{option} is mapped from variant {variant!r}, which the recipe does not "
                      f"declare (variants: {', '.join(sorted(recipe.variants))})")
            continue
        boolean, _ = recipe.variants[variant]
        if COMPONENT_OPTION.match(option) and not boolean:
            err(line, f"{option} is mapped from variant {variant!r}, which is not a boolean "
                      "variant: its value would not be ON or OFF")
        mapped_variants.setdefault(variant, []).append(option)

    for variant, (boolean, line) in sorted(recipe.variants.items()):
        if not boolean:
            continue
        options = [o for o in mapped_variants.get(variant, []) if o in cache]
        if not options:
            err(line, f"variant {variant!r} is mapped onto no CMake option that exists "
                      "(expected define_from_variant(\"DTRAIN_ENABLE_...\", "
                      f"\"{variant}\") in cmake_args())")

    # Options -> variants: each component option has a variant, and gets ON or OFF only.
    for option in components:
        if option in from_variant:
            continue
        if option in defined:
            value, line = defined[option]
            if value is None or _const(value) not in (True, False, "ON", "OFF"):
                err(line, f"{option} must be ON or OFF from a variant, not "
                          f"{ast.unparse(value) if value is not None else 'a raw -D string'}")
            err(line, f"CMake component option {option} is set but from no variant")
        else:
            err(None, f"CMake component option {option} ({cache[option][0]}) has no variant "
                      "in the recipe")

    # GPU architecture variants feed the architecture options the GPU helper reads.
    walked = list(ast.walk(recipe.cmake_args))
    for base, (variant, option) in MIXIN_ARCH_VARIANTS.items():
        if base not in recipe.bases:
            continue
        used = any(isinstance(n, ast.Subscript) and _const(n.slice) == variant for n in walked)
        if option not in cache:
            err(None, f"{base} gives {variant}, but {option} is not in the CMake sources")
        elif not used or option not in defined:
            err(None, f"{base}'s {variant} is not passed to CMake as {option}")

    # Tests, examples and benchmarks default ON at top level: the recipe must decide.
    for option in BUILD_SWITCHES:
        if option not in defined:
            err(None, f"cmake_args() does not set {option} (ON by default at top level)")
            continue
        value, line = defined[option]
        if not (_const(value) is False or _is_run_tests(value)):
            err(line, f"{option} must be False or self.run_tests, not "
                      f"{ast.unparse(value) if value is not None else 'a raw -D string'}")

    # Each of the recipe's own variants brings its dependency; doctest only for tests.
    for variant, (boolean, line) in sorted(recipe.variants.items()):
        if line is None or not boolean:
            continue
        if not any(re.search(r"\+" + re.escape(variant) + r"\b", when)
                   for _, when, _, _ in recipe.depends):
            err(line, f"variant {variant!r} brings no dependency (no depends_on(..., "
                      f"when=\"+{variant}\"))")
    for spec, _, dtype, line in recipe.depends:
        if re.match(r"^doctest\b", spec):
            kinds = ([_const(dtype)] if isinstance(dtype, ast.Constant)
                     else [_const(e) for e in getattr(dtype, "elts", [])])
            if kinds != ["test"]:
                err(line, "doctest must be a test-only dependency (type=\"test\")")

    # The version.
    if project_version is None:
        errors.append("CMakeLists.txt: no project(... VERSION ...) found")
    else:
        numeric = [v for v in recipe.versions if _version_key(v) is not None]
        if not numeric:
            err(None, f"no version() declared (project version is {project_version})")
        else:
            newest = max(numeric, key=_version_key)
            if _version_key(newest) != _version_key(project_version):
                err(None, f"newest version() is {newest}, but CMakeLists.txt has "
                          f"project(dtrain VERSION {project_version})")
    return errors


# ---------------------------------------------------------------------------------------------
# Self-test: altered inputs must be reported.


def _mutations(recipe_text, top_cmake):
    """(description, recipe text, CMakeLists.txt text, substring expected in a report)."""
    def sub(text, old, new):
        if old not in text:
            raise InputError(f"self-test: {old!r} not found; update the mutations")
        return text.replace(old, new, 1)

    r, c = recipe_text, top_cmake
    return [
        ("variant renamed", sub(r, 'variant("mpi",', 'variant("mpi_transport",'), c,
         "variant 'mpi'"),
        ("mapping dropped",
         sub(r, 'self.define_from_variant("DTRAIN_ENABLE_IBVERBS", "ibverbs"),', ""), c,
         "DTRAIN_ENABLE_IBVERBS"),
        ("option misspelt",
         sub(r, '"DTRAIN_ENABLE_HIP", "rocm"', '"DTRAIN_ENABLE_ROCM", "rocm"'), c,
         "DTRAIN_ENABLE_ROCM is not an option"),
        ("AUTO passed",
         sub(r, 'self.define_from_variant("DTRAIN_ENABLE_BLAS", "blas")',
             'self.define("DTRAIN_ENABLE_BLAS", "AUTO")'), c, "AUTO"),
        ("version differs", sub(r, 'version("0.1.0")', 'version("0.2.0")'), c, "0.2.0"),
        ("tests left at their default",
         sub(r, 'self.define("DTRAIN_BUILD_TESTS", self.run_tests),', ""), c,
         "DTRAIN_BUILD_TESTS"),
        ("doctest a link dependency",
         sub(r, 'depends_on("doctest", type="test")', 'depends_on("doctest")'), c, "doctest"),
        ("new CMake component",
         r, sub(c, "foreach(comp MPI HDF5 IBVERBS BLAS CUDA HIP CONFIG)",
                "foreach(comp MPI HDF5 IBVERBS BLAS CUDA HIP CONFIG NCCL)"), "DTRAIN_ENABLE_NCCL"),
    ]


def self_test(recipe_text, cmake_files):
    top = "CMakeLists.txt"
    failures = 0
    for what, r, c, expect in _mutations(recipe_text, cmake_files[top]):
        errors = check(r, {**cmake_files, top: c})
        hit = [e for e in errors if expect in e]
        if hit:
            print(f"self-test: {what}: reported: {hit[0]}")
        else:
            failures += 1
            print(f"self-test: {what}: NOT reported (expected a report naming {expect!r}); "
                  f"got {errors or 'no report'}")
    return failures


def main():
    here = Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-dir", type=Path, default=here.parents[2],
                    help="dtrain source tree (default: the one holding this script)")
    ap.add_argument("--recipe", type=Path, default=None,
                    help="package.py to check (default: packaging/spack/packages/dtrain/"
                         "package.py of the source tree)")
    ap.add_argument("--self-test", action="store_true",
                    help="also check that altered copies of the inputs are reported")
    a = ap.parse_args()

    src = a.source_dir
    recipe_path = a.recipe or src / "packaging/spack/packages/dtrain/package.py"
    try:
        recipe_text = recipe_path.read_text(encoding="utf-8")
        cmake_files = {"CMakeLists.txt": (src / "CMakeLists.txt").read_text(encoding="utf-8")}
        for p in sorted((src / "cmake").glob("*.cmake")):
            cmake_files[f"cmake/{p.name}"] = p.read_text(encoding="utf-8")
        errors = check(recipe_text, cmake_files, str(recipe_path))
        failures = self_test(recipe_text, cmake_files) if a.self_test else 0
    except (OSError, InputError) as e:
        print(f"check_spack_recipe: {e}", file=sys.stderr)
        return 2

    for e in errors:
        print(f"error: {e}")
    if errors or failures:
        print(f"check_spack_recipe: FAILED ({len(errors)} problem(s) in the recipe"
              + (f", {failures} self-test mutation(s) not reported" if failures else "") + ")")
        return 1
    recipe = Recipe(recipe_text, str(recipe_path))
    bools = sorted(v for v, (b, _) in recipe.variants.items() if b)
    print(f"check_spack_recipe: OK: variants {', '.join(bools)} map onto existing options; "
          f"version {', '.join(recipe.versions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
