#!/usr/bin/env bash
# Prints why this machine cannot run a kubelet node for the node e2e suite (it needs root, loop
# devices, overlayfs and cgroups), or nothing when it can.
if [[ $(id -u) != 0 ]]; then
  echo "needs root"
elif [[ ! -e /dev/loop-control ]]; then
  echo "needs loop devices (/dev/loop-control)"
elif ! grep -qw overlay /proc/filesystems; then
  echo "needs overlayfs for containerd's snapshotter"
elif [[ ! -d /sys/fs/cgroup ]]; then
  echo "needs cgroups"
fi
