#!/usr/bin/env bash
# go test for the make targets: `gotest.sh NAME GO_TEST_ARGS...` runs `go test -json` and shows
# it through hack/testreport as go test would (everything when the arguments hold -v). The events
# are kept in _output/test-results/NAME.jsonl, which `make test` summarises at its end. Then the
# gate (hack/testreport/gate.go): the packages this run reported must have passed every test that
# hack/make/expected-tests.txt lists for NAME, and skipped none that hack/make/expected-skips.txt
# does not list; under CI=true a miss fails the target (elsewhere, where suites may skip for want
# of root or a tool, it is printed). `make expected-tests` rewrites the first from a full run.
set -o pipefail
name=${1:?target name}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
results=${CISTERN_TEST_RESULTS:-${root}/_output/test-results}
report=${root}/bin/testreport
mkdir -p "${results}" "${root}/bin"
# Built under another name, then renamed over the old one: the two lanes of `make test` run this
# at the same time, and neither may run a half-written file.
(cd "${root}" && ${GO:-go} build -o "${report}.$$" ./hack/testreport) && mv -f "${report}.$$" "${report}" ||
  { rm -f "${report}.$$"; exit 1; }
verbose=
for a in "$@"; do [[ $a == -v ]] && verbose=-v; done
run=$(mktemp "${results}/.${name}.XXXXXX")
trap 'rm -f "${run}"' EXIT
${GO:-go} test -json "$@" 2>&1 | "${report}" ${verbose} -out "${run}"
rc=$?
cat "${run}" >>"${results}/${name}.jsonl"
"${report}" -gate -target "${name}" -tests "${root}/hack/make/expected-tests.txt" \
  -skips "${root}/hack/make/expected-skips.txt" "${run}" || { [[ ${CI:-} == true ]] && rc=1; }
exit "${rc}"
