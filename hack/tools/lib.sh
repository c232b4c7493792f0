# Sourced by hack/tools/*/build.sh: the one way a tool set is built into the cache, once.
#
# A stamp file holds a key: a hash of what decides the binaries (the tools module's go.mod and
# go.sum, any source the set builds from this tree, the flags, the Go version), never the build
# script's own text, so that editing a comment does not rebuild everyone's cache. When the stamp
# holds the key, nothing is rebuilt; a version bump changes go.mod and therefore the key.
# Concurrent builds of one set (parallel makes, several checkouts sharing the cache) wait for one
# another on a lock next to the stamp.
#
# CISTERN_TOOLS_PRINT_KEY=1 prints the key and the stamp path and builds nothing (to check that a
# change to a script keeps the cache valid).

# tool_key <extra> <file>...: the key of a set built from the files with <extra> (the packages,
# flags and environment, as one line).
tool_key() {
  local extra=$1
  shift
  { cat "$@"; go env GOVERSION; echo "${extra}"; } | sha256sum | cut -d' ' -f1
}

# k8s_ldflags <version>: the version stamps upstream's release build gives a Kubernetes binary
# (what --version and the API server's /version report), into the array ldflags; the minor
# version into k8s_minor.
k8s_ldflags() {
  local version=$1 pkg=k8s.io/component-base/version
  k8s_minor=${version#v1.}
  k8s_minor=${k8s_minor%%.*}
  ldflags=(
    -s -w
    "-X ${pkg}.gitVersion=${version}"
    "-X ${pkg}.gitMajor=1"
    "-X ${pkg}.gitMinor=${k8s_minor}"
    "-X ${pkg}.gitTreeState=clean"
  )
}

# cached_build <name> <stamp> <key> <command>...: runs the command under the stamp's lock unless
# the stamp already holds the key, then writes the key; says which it was and how long it took.
cached_build() {
  local name=$1 stamp=$2 key=$3
  shift 3
  if [[ ${CISTERN_TOOLS_PRINT_KEY:-} == 1 ]]; then
    echo "${name} ${stamp} ${key}"
    return 0
  fi
  mkdir -p "$(dirname "${stamp}")"
  exec 9>"${stamp}.lock"
  flock 9
  if [[ -f ${stamp} && "$(cat "${stamp}")" == "${key}" ]]; then
    echo "${name}: up to date in $(dirname "${stamp}")"
    exec 9>&-
    return 0
  fi
  local start
  start=$(date +%s)
  "$@"
  echo "${key}" >"${stamp}"
  echo "${name}: built in $(($(date +%s) - start))s"
  exec 9>&-
}
