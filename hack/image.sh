#!/usr/bin/env bash
# Builds guestbackup's image as an OCI image layout tarball, without a
# container engine (none runs on the build machines):
#
#   hack/image.sh [OUT]     default OUT: bin/guestbackup-image.tar
#
# The same image as the Dockerfile's: controller, webhook, guestbackup-server,
# guestbackup-restore and kopia (plus kopia for linux/arm64, which server pods hand to arm64
# guests), static, from the pinned modules; plus the CA bundle kopia
# needs for S3 over TLS. IMAGE_TAG names it in the layout's index.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/bin/guestbackup-image.tar}"
TAG="${IMAGE_TAG:-guestbackup:dev}"
cd "$ROOT"
# The caller's tools when it names them (make test grants each package its
# own: hack/test-exec.sh), else the cache's.
[[ -n "${GUESTBACKUP_KOPIA:-}" ]] || eval "$(hack/tools.sh env)"
[[ -x "$GUESTBACKUP_KOPIA" ]] || { echo "image: kopia is not built: run make tools" >&2; exit 1; }
# The arm64 client server pods hand to arm64 guests (the amd64 one is kopia itself).
[[ -s "$GUESTBACKUP_KOPIA_ARM64" ]] || { echo "image: kopia for linux/arm64 is not built: run make tools" >&2; exit 1; }
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
[[ -s "$CA_BUNDLE" ]] || { echo "image: $CA_BUNDLE is missing: apt-get install ca-certificates" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
for cmd in controller webhook server restore; do
	name=$cmd
	[[ $cmd == server || $cmd == restore ]] && name=guestbackup-$cmd
	CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags=-s -o "$work/$name" "./cmd/$cmd"
done
mkdir -p "$(dirname "$OUT")"
(cd hack/image && GOFLAGS=-mod=readonly go run . -out "$OUT" -tag "$TAG" \
	-file "/usr/local/bin/controller=$work/controller" \
	-file "/usr/local/bin/webhook=$work/webhook" \
	-file "/usr/local/bin/guestbackup-server=$work/guestbackup-server" \
	-file "/usr/local/bin/guestbackup-restore=$work/guestbackup-restore" \
	-file "/usr/local/bin/kopia=$GUESTBACKUP_KOPIA" \
	-file "/usr/local/share/guestbackup/kopia-linux-arm64=$GUESTBACKUP_KOPIA_ARM64" \
	-file "/etc/ssl/certs/ca-certificates.crt=$CA_BUNDLE" \
	-entrypoint /usr/local/bin/controller)
echo "image: wrote $OUT ($TAG, $(du -h "$OUT" | cut -f1)) in $((SECONDS - start))s" >&2
