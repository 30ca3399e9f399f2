#!/usr/bin/env bash
# go test -exec runs each test binary through this script, in the folder of
# the binary's package: it gives the binary the test bed's environment with
# only the tools hack/test-tools.txt lists for that package (every other
# tool's variable points at a path that says so), then runs it. So a package
# that uses a tool its line does not list fails in `make test`, and
# `make test WHAT=...`, which builds only the listed tools, can trust the list.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg=$(realpath --relative-to="$ROOT" "$PWD")
tools=$(awk -v p="$pkg" '$1 == p { $1 = ""; print; exit }' "$ROOT/hack/test-tools.txt")
# shellcheck disable=SC2086 # the tools are words
env=$("$ROOT/hack/tools.sh" env ${tools:-none})
eval "$env"
exec "$@"
