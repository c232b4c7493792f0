#!/usr/bin/env bash
# `make help`: every target of the Makefile and hack/make/*.mk with its `## ` line, in the order the
# files define them. A target's `## ` line is one line saying what it does, in the comment block
# above the rule (the plain `# ` lines around it say why and how; .PHONY and variable lines may
# stand between it and the rule, a blank line may not). --check lists the targets without one and
# fails when there are any (make vet runs it), so a new target cannot go undescribed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
check=0
[[ ${1:-} == --check ]] && check=1

# One "target<TAB>description" line per target, first definition with a comment wins.
listing=$(awk '
  FNR == 1 { help = "" }
  /^[ \t]*$/ { help = ""; next }
  /^## / { line = $0; sub(/^## /, "", line); help = help == "" ? line : help " " line; next }
  /^#/ || /^\t/ { next }
  # A rule: names (no variables, no special .TARGETS) before a single colon.
  /^[A-Za-z0-9_-][A-Za-z0-9_ -]*:([^=]|$)/ {
    names = $0; sub(/:.*/, "", names)
    n = split(names, t, " ")
    for (i = 1; i <= n; i++) {
      if (!(t[i] in seen)) { seen[t[i]] = 1; order[++count] = t[i] }
      if (desc[t[i]] == "" && help != "") desc[t[i]] = help
    }
    help = ""
    next
  }
  END { for (i = 1; i <= count; i++) printf "%s\t%s\n", order[i], desc[order[i]] }
' "${root}/Makefile" $(ls "${root}"/hack/make/*.mk | sort))

if ((check)); then
  missing=$(awk -F '\t' '$2 == "" { print $1 }' <<<"${listing}")
  if [[ -n ${missing} ]]; then
    echo "make help: these targets have no \`## \` line above them (one line saying what they do):"
    sed 's/^/  /' <<<"${missing}"
    exit 1
  fi
  exit 0
fi

echo "Targets (make <target>; see README.md and docs/testing.md):"
awk -F '\t' '{ printf "  %-22s %s\n", $1, $2 }' <<<"${listing}"
