#!/usr/bin/env bash
# Runs the command given (the generators) and fails when it changed any file git sees: modified,
# added (untracked) or deleted. Only what the command changes counts, so a tree with uncommitted
# edits passes as long as its generated files match its sources.
#
#   verify-generated.sh make generate proto
set -euo pipefail
cd "$(dirname "$0")/.."

# Each changed or untracked path with the hash of its content (or "deleted").
state() {
  git status --porcelain=v1 -z --untracked-files=all --no-renames | tr '\0' '\n' | cut -c4- | sort -u |
    while IFS= read -r f; do
      if [[ -e "$f" ]]; then echo "$(git hash-object -- "$f") $f"; else echo "deleted $f"; fi
    done
}

before=$(state)
"$@"
after=$(state)
if [[ "$before" != "$after" ]]; then
  changed=$(diff <(echo "$before") <(echo "$after") | sed -n 's/^[<>] [^ ]* //p' | sort -u || true)
  echo "verify: the generators changed these files; run \`make generate proto\` and commit the result:"
  echo "$changed" | sed 's/^/  /'
  echo "$changed" | xargs -r git --no-pager diff --stat --
  exit 1
fi
echo "verify: generated code is up to date"
