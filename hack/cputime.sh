# shellcheck shell=bash
# Sourced by hack/test.sh and hack/test-exec.sh.

# children_cpu sets CHILDREN_CPU to the CPU seconds (user and system) this
# shell's waited-for children used, and theirs in turn. Called as a
# function, not in a pipe or $(...): there `times` would run in a subshell,
# which has no children. `times` prints the shell's own line, then the
# children's, each as <minutes>m<seconds>s.
children_cpu() {
	local usage
	usage=$(mktemp)
	times >"$usage"
	# shellcheck disable=SC2034 # read by the scripts that source this one
	CHILDREN_CPU=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, f, "m"); t += f[1] * 60 + f[2] } printf "%d", t + 0.5 }' "$usage")
	rm -f "$usage"
}
