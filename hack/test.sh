#!/usr/bin/env bash
# Runs the tests against the real test bed, and says where the time went.
#
#   hack/test.sh               every tool, every check, every package: `make test`, what CI runs
#   hack/test.sh PATTERN...    those packages only (`make test WHAT=./pkg/mutate/...`),
#                              building only the tools hack/test-tools.txt lists for them
#
# Each test binary runs through hack/test-exec.sh, which grants its package
# only the tools hack/test-tools.txt lists. GO_TEST_FLAGS adds go test flags.
# Whatever the outcome, it ends with a breakdown: the wall time of each tool
# built, of each check, and of each test package's run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Packages that start API servers and Kopia servers take minutes on 2 cores;
# the guest suites boot guests under software emulation. The timeout catches
# a hang (with every goroutine's stack) within CI's own 90-minute limit; it is
# not a speed target.
# -count=1 always: the tools a package is granted come from hack/test-exec.sh,
# which go test's result cache does not see.
read -r -a flags <<<"-count=1 ${GO_TEST_FLAGS:--timeout=75m}"
# go test builds and runs packages in the order they are named, -p (the
# number of cores) at a time. Naming the longest first keeps the last
# minutes from running one long package on one core while the other idles
# (longest first, as a scheduler would): make test records each package's
# run time in DURATIONS and orders the next run by it. Without a record, the
# two suites that boot guests, the longest by far, come first.
LONG_TEST_PACKAGES=(./test/kubevirt ./test/cluster)
DURATIONS="${GUESTBACKUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/guestbackup}/test-durations.txt"

TIMINGS=$(mktemp)
OUT=$(mktemp)
START=$SECONDS
export GUESTBACKUP_TIMINGS=$TIMINGS
# shellcheck source=hack/cputime.sh
source "$ROOT/hack/cputime.sh"
trap 'breakdown; rm -f "$TIMINGS" "$OUT"' EXIT

log() { printf 'test: %s\n' "$*" >&2; }

# phase NAME CMD... runs CMD and records its wall time under NAME.
phase() {
	local name=$1 start=$SECONDS rc=0
	shift
	log "$name"
	# In the background, so that errexit holds inside a function CMD (one
	# called where its status is tested runs without it).
	"$@" &
	wait $! || rc=$?
	echo "$name $((SECONDS - start))" >>"$TIMINGS"
	return "$rc"
}

# breakdown prints where the time went: the tools built, the checks, and
# each test package's run (go test runs -p of them at a time, so they add up
# to more than the wall time).
breakdown() {
	local rc=$?
	{
		echo
		echo "==> where the time went ($((SECONDS - START)) s in all, exit status $rc)"
		if grep -q '^tools/' "$TIMINGS"; then
			echo "tools built (two lanes at once, so they add up to more than the tools step):"
			grep '^tools/' "$TIMINGS" | sort -k2 -nr | awk '{ printf "  %-28s %6d s\n", substr($1, 7), $2 }'
		fi
		echo "steps:"
		{ grep -v -e '^tools/' -e '^cpu/' "$TIMINGS" || true; } | awk '{ printf "  %-28s %6d s\n", $1, $2 }'
		if [[ -n "$(package_times)" ]]; then
			echo "test packages (run time of each, $(nproc) at a time; CPU time of the package and the processes it ran):"
			package_times | sort -k2 -nr | awk -v timings="$TIMINGS" '
				BEGIN { while ((getline line < timings) > 0) { split(line, f, " "); if (f[1] ~ /^cpu\//) cpu[substr(f[1], 5)] = f[2] } }
				{ printf "  %-28s %6d s  cpu %6s s  %s\n", $1, $2, ($1 in cpu ? cpu[$1] : "?"), ($3 == "ok" ? "" : "FAILED") }'
		fi
		# This script's waited-for children: every build, check and test.
		children_cpu
		awk -v t="$CHILDREN_CPU" -v wall=$((SECONDS - START)) -v cores="$(nproc)" 'BEGIN {
			if (wall > 0) printf "CPU: %d s used of the %d s that %d cores offered (%d%%)\n", t, wall * cores, cores, 100 * t / (wall * cores) }'
	} >&2
}

# package_times prints "<./package> <seconds>" for each package go test
# reported in OUT.
package_times() {
	awk '$1 ~ /^(ok|FAIL)$/ && $3 ~ /^[0-9.]+s$/ { sub(/^github.com\/guestbackup\/guestbackup\/?/, "./", $2); t = $3; sub(/s$/, "", t); printf "%s %d %s\n", $2, t + 0.5, $1 }' "$OUT"
}

# longest_first prints the packages of the last recorded run that still
# exist, longest first; without a record, LONG_TEST_PACKAGES.
longest_first() {
	if [[ ! -s "$DURATIONS" ]]; then
		printf '%s\n' "${LONG_TEST_PACKAGES[@]}"
		return
	fi
	local pkg
	sort -k2 -nr "$DURATIONS" | while read -r pkg _; do
		[[ -d "$pkg" ]] && echo "$pkg"
	done
	return 0
}

# tools_for PATTERN... prints the tools hack/test-tools.txt lists for the
# packages the patterns match.
tools_for() {
	local dirs
	dirs=$(go list -f '{{.Dir}}' "$@") || exit 1
	local d rel
	for d in $dirs; do
		rel=$(realpath --relative-to="$ROOT" "$d")
		awk -v p="$rel" '$1 == p { $1 = ""; print; exit }' hack/test-tools.txt
	done | tr ' ' '\n' | sort -u | tr '\n' ' '
}

if (($# == 0)); then
	# What CI runs: every tool, KubeVirt's images for the cluster backend
	# included, the checks, then every package, test/cluster too (a plain
	# `go test ./...` skips it unless GUESTBACKUP_E2E=cluster selects it).
	phase tools hack/tools.sh install all cluster
	# The Makefile's own targets, which also run alone.
	phase verify-generated make --no-print-directory verify-generated
	phase vet make --no-print-directory vet
	phase lint-chart make --no-print-directory lint-chart
	mapfile -t order < <(longest_first)
	log "longest first: ${order[*]:0:6} ..."
	# The packages before the flags: go test takes a flag it does not know
	# (-ginkgo.v) as the end of the package list.
	rc=0
	phase "go-test" env GUESTBACKUP_E2E=cluster go test -exec "$ROOT/hack/test-exec.sh" \
		"${order[@]}" ./... "${flags[@]}" 2>&1 | tee "$OUT" || rc=$?
	# Only a whole run's times order the next one.
	if [[ -n "$(package_times)" ]]; then
		mkdir -p "$(dirname "$DURATIONS")"
		package_times | awk '{ print $1, $2 }' >"$DURATIONS.tmp" && mv -f "$DURATIONS.tmp" "$DURATIONS"
	fi
	exit "$rc"
else
	tools=$(tools_for "$@")
	log "packages: $*; tools: ${tools:-none}"
	# shellcheck disable=SC2086 # the tools are words
	[[ -z "$tools" ]] || phase tools hack/tools.sh install $tools
	e2e=""
	# test/cluster runs only when selected, as in make test.
	[[ " $(go list "$@" | tr '\n' ' ') " == *"/test/cluster "* ]] && e2e=cluster
	phase "go-test" env GUESTBACKUP_E2E=$e2e go test -exec "$ROOT/hack/test-exec.sh" "$@" "${flags[@]}" 2>&1 | tee "$OUT"
fi
