#!/usr/bin/env bash
# `make host-packages`: installs the Debian packages the builds and suites need, those missing, in
# one apt-get (the package lists are fetched only when the install cannot find a package, as on a
# fresh machine). Each argument is <what to look for>=<package>: a command on the PATH, or an
# absolute path that exists once the package is installed.
#
#   host-packages.sh protoc=protobuf-compiler /usr/include/seccomp.h=libseccomp-dev ...
#
# Where it cannot install (not root, no apt-get) it names what is missing and leaves the failure to
# whatever needs it, which says so itself.
set -euo pipefail
need=()
for arg in "$@"; do
  what=${arg%%=*} pkg=${arg#*=}
  if [[ ${what} == /* ]]; then
    [[ -e ${what} ]] && continue
  else
    command -v "${what}" >/dev/null && continue
  fi
  need+=("${pkg}")
done
((${#need[@]})) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "host-packages: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
  exit 0
fi
echo "host-packages: installing ${need[*]}"
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }
install 2>/dev/null || { apt-get update -qq && install; }
