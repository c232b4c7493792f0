#!/usr/bin/env bash
# `require-node.sh TARGET`: exits 0 when this machine can run a kubelet node
# (hack/tools/node/check-host.sh). When it cannot, it exits 2 after recording the skip for the
# summary of `make test`, or, under CI=true, 1: CI must not pass by skipping a suite.
reason=$("$(dirname "$0")/../tools/node/check-host.sh")
[[ -z ${reason} ]] && exit 0
if [[ ${CI:-} == true ]]; then
  echo "$1: FAILED: this machine cannot run a kubelet node: ${reason} (CI=true: a suite that cannot run fails)"
  exit 1
fi
echo "$1: SKIPPED: this machine cannot run a kubelet node: ${reason}"
results=${CISTERN_TEST_RESULTS:-$(cd "$(dirname "$0")/../.." && pwd)/_output/test-results}
mkdir -p "${results}"
echo "$1: ${reason}" >>"${results}/skipped-targets.txt"
exit 2
