#!/usr/bin/env bash
# `make test`: every target of TEST_TARGETS with `make -k`, so one failing suite does not hide
# the others; then the tests and targets that failed or skipped, and the totals. Exits non-zero
# when any target failed.
#
# With TEST_LANES=2 (the Makefile's default) the targets of TEST_FIRST that are asked for run
# first, with TEST_PREREQS (what both lanes build); then two lanes side by side, each in the
# order given: the targets of TEST_SECOND_LANE, whose lines are printed with the prefix
# "node| ", and every other one. TEST_LANES=1 runs them all one after the other.
set -o pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
results=${CISTERN_TEST_RESULTS:-${root}/_output/test-results}
rm -rf "${results}"
mkdir -p "${results}"
export CISTERN_TEST_RESULTS=${results}

start=${SECONDS}
# make_k LOG TARGET...: make -k of the targets, its output shown and kept in LOG; returns make's
# exit code.
make_k() {
  local log=$1
  shift
  ${MAKE:-make} -k --no-print-directory "$@" 2>&1 | tee "${log}"
  return "${PIPESTATUS[0]}"
}

if [[ ${TEST_LANES:-1} != 2 ]]; then
  make_k "${results}/make.log" "$@"
  rc=$?
else
  first=() lane1=() lane2=()
  for t in "$@"; do
    if [[ " ${TEST_FIRST:-} " == *" ${t} "* ]]; then
      first+=("${t}")
    elif [[ " ${TEST_SECOND_LANE:-} " == *" ${t} "* ]]; then
      lane2+=("${t}")
    else
      lane1+=("${t}")
    fi
  done
  rc=0
  if ((${#lane1[@]} && ${#lane2[@]})); then
    # shellcheck disable=SC2206 # a list of make targets
    first+=(${TEST_PREREQS:-})
  fi
  if ((${#first[@]})); then
    make_k "${results}/make-first.log" "${first[@]}" || rc=$?
  fi
  lanes_start=${SECONDS}
  if ((${#lane2[@]})); then
    # The second lane in the background, its lines prefixed; its exit code and length in files.
    {
      make_k "${results}/make-lane2.log" "${lane2[@]}" | sed -u 's/^/node| /'
      echo "${PIPESTATUS[0]}" >"${results}/.lane2.rc"
      echo $((SECONDS - lanes_start)) >"${results}/.lane2.s"
    } &
    lane2_pid=$!
  fi
  if ((${#lane1[@]})); then
    make_k "${results}/make-lane1.log" "${lane1[@]}" || rc=$?
  fi
  lane1_s=$((SECONDS - lanes_start))
  if ((${#lane2[@]})); then
    wait "${lane2_pid}"
    lane2_rc=$(cat "${results}/.lane2.rc" 2>/dev/null || echo 1)
    ((lane2_rc == 0)) || rc=${lane2_rc}
    if ((${#lane1[@]})); then
      echo "make test: the lanes took ${lane1_s} s (${lane1[*]}) and $(cat "${results}/.lane2.s") s (${lane2[*]})"
    fi
    rm -f "${results}/.lane2.rc" "${results}/.lane2.s"
  fi
  cat "${results}"/make-first.log "${results}"/make-lane1.log "${results}"/make-lane2.log \
    >"${results}/make.log" 2>/dev/null
fi

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
# Every package with tests ran in some suite, or hack/make/not-in-make-test.txt says where it runs
# instead: checked when the whole TEST_TARGETS ran (TEST_CHECK_PACKAGES=1, set by make test).
if [[ ${TEST_CHECK_PACKAGES:-} == 1 ]]; then
  shopt -s nullglob
  missing=$(comm -23 \
    <(cd "${root}" && ${GO:-go} list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... | sort -u) \
    <({
      cat "${results}"/*.jsonl | sed -nE 's/.*"Package":"([^"]+)".*/\1/p'
      module=$(cd "${root}" && ${GO:-go} list -m)
      grep -vE '^(#|$)' "${root}/hack/make/not-in-make-test.txt" | awk -v m="${module}" '{sub(/^\./, m, $1); print $1}'
    } | sort -u))
  if [[ -n ${missing} ]]; then
    echo "Packages with tests that no suite ran (add them to a TEST_TARGETS suite, or to hack/make/not-in-make-test.txt with the reason):"
    sed 's/^/  MISSING /' <<<"${missing}"
    echo "make test: FAILED (packages with tests not run)"
    rc=1
  fi
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
