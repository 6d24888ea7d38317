#!/usr/bin/env bash
# doc_snippets.sh <source root> <work dir> <mpicc> <mpifort> [module dir]: the first ```c and
# ```fortran programs of docs/fortran-and-c.md compile (C11 -pedantic, Fortran 2018, warnings as
# errors) against bindings/c/dtrain.h and the module of bindings/fortran/dtrain.f90: the dtrain.mod
# in [module dir] (the fortran test's build), else compiled here first.
set -euo pipefail
root=$1 work=$2 mpicc=$3 mpifort=$4 mod=${5:-}
page="$root/docs/fortran-and-c.md"
rm -rf "$work"
mkdir -p "$work"
block() {  # <language> <output>: the first fenced block of that language
  awk -v lang="$1" '$0 == "```" lang {on = 1; next} on && /^```/ {exit} on {print}' "$page" > "$2"
  test -s "$2" || { echo "FAIL: $page has no \`\`\`$1 block"; exit 1; }
}
block c "$work/snippet.c"
block fortran "$work/snippet.f90"
"$mpicc" -std=c11 -Wall -Wextra -pedantic -Werror -fsyntax-only -I "$root/bindings/c" \
  "$work/snippet.c"
if [ -z "$mod" ] || [ ! -f "$mod/dtrain.mod" ]; then
  mod=$work
  "$mpifort" -std=f2018 -Wall -Werror -J "$work" -c "$root/bindings/fortran/dtrain.f90" \
    -o "$work/dtrain.o"
fi
"$mpifort" -std=f2018 -Wall -Werror -fsyntax-only -I "$mod" -J "$work" "$work/snippet.f90"
echo "docs/fortran-and-c.md: the C and Fortran programs compile"
