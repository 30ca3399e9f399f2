#!/usr/bin/env bash
# go test -exec runs each test binary through this script, in the folder of
# the binary's package: it gives the binary the test bed's environment with
# only the tools hack/test-tools.txt lists for that package (every other
# tool's variable points at a path that says so), then runs it. So a package
# that uses a tool its line does not list fails in `make test`, and
# `make test WHAT=...`, which builds only the listed tools, can trust the list.
#
# Under hack/test.sh (GUESTBACKUP_TIMINGS set) it also records the CPU time
# the package used, its test binary and every process that binary started
# and waited for (API servers, Kopia, qemu), as "cpu/<package> <seconds>":
# the breakdown sets it beside the wall time, which says how much of the
# run's two cores a package kept busy.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg=$(realpath --relative-to="$ROOT" "$PWD")
tools=$(awk -v p="$pkg" '$1 == p { $1 = ""; print; exit }' "$ROOT/hack/test-tools.txt")
# shellcheck disable=SC2086 # the tools are words
env=$("$ROOT/hack/tools.sh" env ${tools:-none})
eval "$env"
[[ -n "${GUESTBACKUP_TIMINGS:-}" ]] || exec "$@"

# The binary runs as a child, so that its CPU time can be read once it
# ends. The signals go test sends a test binary (SIGQUIT for a stack dump at
# its timeout, then SIGKILL, which this script cannot catch: go test kills
# the whole process group) and those of a terminal are passed on to it.
"$@" &
child=$!
for sig in INT TERM QUIT HUP; do
	# shellcheck disable=SC2064 # the signal and the child are fixed now
	trap "kill -$sig $child 2>/dev/null || true" "$sig"
done
rc=0
# wait returns early when a trapped signal arrives; wait again for the exit.
while :; do
	wait "$child" && rc=0 || rc=$?
	kill -0 "$child" 2>/dev/null || break
done
# shellcheck source=hack/cputime.sh
source "$ROOT/hack/cputime.sh"
children_cpu
echo "cpu/./$pkg $CHILDREN_CPU" >>"$GUESTBACKUP_TIMINGS"
exit "$rc"
