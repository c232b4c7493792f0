#!/usr/bin/env bash
# Builds upstream LeaderWorkerSet's controller manager from this module into <dir>/bin (as
# manager, the name upstream's image gives it) and copies the manifests the tests install next to
# it (its CRD, webhook configurations and samples) into <dir>/config, once per version:
# hack/tools/csi/build.sh keeps the stamp.
#
#   build.sh <dir>
set -euo pipefail
cd "$(dirname "$0")"
dir=${1:?dir}
# The main package is sigs.k8s.io/lws/cmd, so go build names the binary cmd.
../csi/build.sh -C ../lws "${dir}/bin" sigs.k8s.io/lws sigs.k8s.io/lws/cmd
ln -sf cmd "${dir}/bin/manager"
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/lws)
exec 9>"${dir}/config.lock"
flock 9
if [[ ! -f "${dir}/config/.done" ]]; then
  rm -rf "${dir}/config"
  mkdir -p "${dir}/config/crd" "${dir}/config/samples"
  cp "${src}"/config/crd/bases/*.yaml "${dir}/config/crd/"
  cp "${src}/config/webhook/manifests.yaml" "${dir}/config/webhooks.yaml"
  cp "${src}"/docs/examples/sample/lws*.yaml "${dir}/config/samples/"
  chmod -R u+w "${dir}/config"
  touch "${dir}/config/.done"
fi
