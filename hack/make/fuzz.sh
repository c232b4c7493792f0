#!/usr/bin/env bash
# Go native fuzzing of the inputs tenants, peers and disks control: `fuzz.sh NAME TIME PKG:FUZZ...`
# runs each target for TIME (go test -fuzz takes one target of one package per run), its seed
# corpus (f.Add and testdata/fuzz/FUZZ/) first. Results go through gotest.sh as NAME-FUZZ. A
# failing input is written to the package's testdata/fuzz/FUZZ/: commit it with the fix.
set -o pipefail
name=${1:?name} time=${2:?fuzz time}
shift 2
here=$(dirname "$0")
rc=0
for target in "$@"; do
  pkg=${target%%:*} fn=${target##*:}
  "${here}/gotest.sh" "${name}-${fn}" -count=1 -run "^${fn}\$" -fuzz "^${fn}\$" -fuzztime "${time}" "${pkg}" || rc=1
done
exit "${rc}"
