#!/usr/bin/env bash
# Prints why this machine cannot run a kubelet node for the node-level suites (they need root,
# loop devices, overlayfs and cgroups), or nothing when it can. Loads the loop and overlay
# modules first when they are missing: a fresh machine often has them as modules not yet loaded.
if [[ $(id -u) != 0 ]]; then
  echo "needs root"
  exit 0
fi
if [[ ! -e /dev/loop-control ]]; then
  modprobe loop 2>/dev/null
fi
if ! grep -qw overlay /proc/filesystems; then
  modprobe overlay 2>/dev/null
fi
if [[ ! -e /dev/loop-control ]]; then
  echo "needs loop devices (/dev/loop-control; modprobe loop failed)"
elif ! grep -qw overlay /proc/filesystems; then
  echo "needs overlayfs for containerd's snapshotter (modprobe overlay failed)"
elif [[ ! -d /sys/fs/cgroup ]]; then
  echo "needs cgroups"
fi
