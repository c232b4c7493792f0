#!/usr/bin/env bash
# `make test`: every target of TEST_TARGETS with `make -k`, so one failing suite does not hide
# the others; then the tests and targets that failed or skipped, and the totals. Exits non-zero
# when any target failed.
set -o pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
results=${CISTERN_TEST_RESULTS:-${root}/_output/test-results}
rm -rf "${results}"
mkdir -p "${results}"
export CISTERN_TEST_RESULTS=${results}

start=${SECONDS}
${MAKE:-make} -k --no-print-directory "$@" 2>&1 | tee "${results}/make.log"
rc=${PIPESTATUS[0]}

echo
echo "=== make test: summary ($((SECONDS - start)) s)"
if [[ -s ${results}/skipped-targets.txt ]]; then
  echo "Skipped targets:"
  sed 's/^/  SKIP /' "${results}/skipped-targets.txt"
fi
# make prints "make[1]: *** [file:line: target] Error N" for each recipe that failed.
failed_targets=$(grep -oE '\*\*\* \[[^]]*\] Error [0-9]+' "${results}/make.log" | sed -E 's/.*\[([^]:]*:[0-9]+: )?([^]]*)\].*/\2/' | sort -u)
if [[ -n ${failed_targets} ]]; then
  echo "Failed targets:"
  sed 's/^/  FAIL /' <<<"${failed_targets}"
fi
if ((rc != 0)); then
  echo "make test: FAILED (make exited ${rc})"
fi
# Last, the totals line ("tests: N passed, N failed, N skipped").
shopt -s nullglob
jsonl=("${results}"/*.jsonl)
if ((${#jsonl[@]})); then
  "${root}/bin/testreport" -summary "${jsonl[@]}"
else
  echo "tests: 0 passed, 0 failed, 0 skipped"
fi
exit "${rc}"
