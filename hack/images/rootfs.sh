#!/usr/bin/env bash
# Prints the path of the node image's Debian root filesystem (a tar), building it once with
# mmdebstrap: the suite and the packages are those of the Dockerfile's node stage
# (debian:<suite>-slim + `apt-get install --no-install-recommends ...`), trimmed as Debian's slim
# images are (no docs, man pages or locales). Packages come through this machine's apt sources
# when they are for that suite. Cached in $CISTERN_CACHE/node-rootfs/ under a key of all of it.
#
#   rootfs.sh <Dockerfile>
set -euo pipefail

dockerfile=${1:?Dockerfile}
cache=${CISTERN_CACHE:-${HOME}/.cache/cistern}/node-rootfs
suite=$(sed -nE 's/^FROM debian:([a-z]+)-slim AS node.*/\1/p' "${dockerfile}")
packages=$(sed -nE '/^FROM debian:.* AS node/,/^FROM /s/.*apt-get install -y --no-install-recommends ([a-z0-9. +-]+).*/\1/p' "${dockerfile}" | tr -s ' ' | sed 's/ *$//')
if [[ -z ${suite} || -z ${packages} ]]; then
  echo "rootfs.sh: cannot read the node stage's suite and packages from ${dockerfile}" >&2
  exit 1
fi

# This machine's apt sources, when they serve the suite; else mmdebstrap's default mirror.
mirror=()
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
  if [[ -f ${f} ]] && grep -qE "(^Suites:.*| )${suite}( |$)" "${f}"; then
    mirror=("${f}")
    break
  fi
done
opts=(
  --variant=minbase --mode=root --format=tar --skip=output/dev
  --include="${packages// /,}"
  --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
)
# A snapshot mirror's Release files are past their Valid-Until; follow this machine's setting.
# (Not `apt-config dump | grep -q`: under pipefail grep's early exit makes that flaky.)
if [[ $(apt-config dump 2>/dev/null) == *'Acquire::Check-Valid-Until "false";'* ]]; then
  opts+=(--aptopt='Acquire::Check-Valid-Until "false"')
fi

key=$( { echo "${suite}"; echo "${packages}"; printf '%s\n' "${opts[@]}"; [[ ${#mirror[@]} == 0 ]] || cat "${mirror[0]}"; } | sha256sum | cut -c1-16)
out=${cache}/${suite}-${key}.tar
if [[ -s ${out} ]]; then
  echo "${out}"
  exit 0
fi
"$(dirname "$0")/../make/host-packages.sh" mmdebstrap=mmdebstrap >&2
mkdir -p "${cache}"
start=${SECONDS}
echo "rootfs.sh: mmdebstrap ${suite} with ${packages} -> ${out}" >&2
# Fixed timestamps, so the layer's digest depends on the packages only.
SOURCE_DATE_EPOCH=0 mmdebstrap "${opts[@]}" "${suite}" "${out}.tmp" "${mirror[@]}" >&2
mv "${out}.tmp" "${out}"
echo "rootfs.sh: built in $((SECONDS - start)) s" >&2
echo "${out}"
