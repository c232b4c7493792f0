#!/usr/bin/env bash
# Copies the replace directives of an upstream CSI sidecar's go.mod into this module, so that it
# builds against exactly the dependencies upstream releases with.
#   ./gen-replaces.sh github.com/kubernetes-csi/external-provisioner/v6 v6.4.0
set -euo pipefail
cd "$(dirname "$0")"

mod=${1:?module path}
version=${2:?version}
dir=$(go mod download -json "${mod}@${version}" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')

go mod edit -require="${mod}@${version}"
# Drop what a previous run wrote, then copy upstream's replaces verbatim.
for old in $(go mod edit -json | awk '/"Old":/{getline; gsub(/[",]/,""); print $2}'); do
  go mod edit -dropreplace="${old}"
done
for r in $(go mod edit -json "${dir}/go.mod" |
  awk '/"Old":/{getline; gsub(/[",]/,""); o=$2} /"New":/{getline; gsub(/[",]/,""); n=$2; getline; gsub(/[",]/,""); print o "=" n "@" $2}'); do
  go mod edit -replace="${r}"
done
echo "copied $(go mod edit -json | grep -c '"Old":') replace directives from ${mod}@${version}"
