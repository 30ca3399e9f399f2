#!/usr/bin/env bash
# Fails when a generated file in the work tree differs from what
# hack/generate.sh produces now: someone edited a generated file by hand, or
# changed its source (markers, pinned modules) without running `make generate`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$ROOT/hack/generate.sh" "$tmp"

stale=0
for path in api/v1alpha1/zz_generated.deepcopy.go docs/api.md docs/api-guestsnapshot.md docs/api-guestrestore.md charts/guestbackup/files/crds charts/guestbackup/files/rbac config/rbac test/crds test/manifests; do
	if ! diff -ruN "$ROOT/$path" "$tmp/$path" >"$tmp/diff" 2>&1; then
		echo "verify-generated: $path is stale:" >&2
		head -n 40 "$tmp/diff" >&2
		stale=1
	fi
done
if ((stale)); then
	echo "verify-generated: run 'make generate' and commit the result" >&2
	exit 1
fi
echo "verify-generated: generated files are up to date"
