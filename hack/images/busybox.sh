#!/usr/bin/env bash
# Puts a static busybox at <dest> for the git image's /bin/sh, once: Debian's busybox-static
# package is downloaded and unpacked, not installed, so the host's own busybox (often the
# dynamically linked one, for the initramfs) is left alone.
#
#   busybox.sh <dest>
set -euo pipefail

dest=${1:?destination file}
if [[ -x "${dest}" ]]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT
cd "${work}"
# The package lists may be missing on a fresh machine.
apt-get download -qq busybox-static 2>/dev/null || { apt-get update -qq && apt-get download -qq busybox-static; }
dpkg-deb -x busybox-static_*.deb root
mkdir -p "$(dirname "${dest}")"
install -m 0755 root/bin/busybox "${dest}"
echo "busybox: $(dpkg-deb -f busybox-static_*.deb Version) -> ${dest}"
