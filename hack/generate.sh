#!/usr/bin/env bash
# Writes every generated file of the repository under OUT (default: the
# repository itself):
#   api/v1alpha1/zz_generated.deepcopy.go      controller-gen object
#   charts/guestbackup/files/crds/             controller-gen crd (our API), which the chart renders
#   docs/api.md, docs/api-guest{snapshot,restore}.md, docs/api-backupclient.md  the API references, from those CRDs (hack/apidoc)
#   config/rbac/{controller,webhook}/role.yaml controller-gen rbac (each binary's packages' markers)
#   config/rbac/server-maintenance/role.yaml   the same for the server pods' maintenance election (pkg/serverpod/maintenance)
#   charts/guestbackup/files/rbac/             the same three roles, which the chart's ClusterRoles read
#   test/crds/kubevirt/                        KubeVirt's CRDs, as virt-operator installs them (hack/tools/kubevirt)
#   test/manifests/kubevirt/                   KubeVirt's RBAC and webhook configurations, as virt-operator installs them
#   test/crds/cert-manager/                    cert-manager's CRDs from the pinned module
#   test/crds/velero/                          Velero's BackupStorageLocation CRD, from VELERO_VERSION
# hack/verify-generated.sh runs it into a temporary OUT and compares.
set -euo pipefail

# Velero is not a dependency of guestbackup (its BSLs are read unstructured),
# so its version is pinned here rather than in go.mod.
VELERO_VERSION=v1.17.1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT}" && cd "${1:-$ROOT}" && pwd)"
cd "$ROOT"

CONTROLLER_GEN="${GUESTBACKUP_CONTROLLER_GEN:-}"
if [[ -z "$CONTROLLER_GEN" ]]; then
	eval "$(hack/tools.sh env)"
	CONTROLLER_GEN="$GUESTBACKUP_CONTROLLER_GEN"
fi
[[ -x "$CONTROLLER_GEN" ]] || { echo "generate: controller-gen missing at $CONTROLLER_GEN: run make tools" >&2; exit 1; }

mkdir -p "$OUT/api/v1alpha1" "$OUT/charts/guestbackup/files/crds" "$OUT/charts/guestbackup/files/rbac" "$OUT/config/rbac/controller" "$OUT/config/rbac/webhook" "$OUT/config/rbac/server-maintenance" "$OUT/config/rbac/controller-requests" \
	"$OUT/test/crds/kubevirt" "$OUT/test/crds/cert-manager" "$OUT/test/crds/velero"

"$CONTROLLER_GEN" object paths=./api/... output:object:dir="$OUT/api/v1alpha1"
"$CONTROLLER_GEN" crd paths=./api/... output:crd:dir="$OUT/charts/guestbackup/files/crds"
mkdir -p "$OUT/docs"
go run ./hack/apidoc "$OUT/charts/guestbackup/files/crds/guestbackup.io_backupstoragelocationservers.yaml" "$OUT/docs/api.md"
go run ./hack/apidoc "$OUT/charts/guestbackup/files/crds/guestbackup.io_guestsnapshots.yaml" "$OUT/docs/api-guestsnapshot.md"
go run ./hack/apidoc "$OUT/charts/guestbackup/files/crds/guestbackup.io_guestrestores.yaml" "$OUT/docs/api-guestrestore.md"
go run ./hack/apidoc "$OUT/charts/guestbackup/files/crds/guestbackup.io_backupclients.yaml" "$OUT/docs/api-backupclient.md"
# One ClusterRole per binary, each from the markers of the packages it runs.
rm -f "$OUT/config/rbac/role.yaml"
"$CONTROLLER_GEN" rbac:roleName=guestbackup-controller paths=./cmd/controller/... \
	paths=./pkg/kopiaserver/... paths=./pkg/credentials/... paths=./pkg/audit/... paths=./pkg/backupclient/... output:rbac:dir="$OUT/config/rbac/controller"
# The controller's rules for requests: the chart installs them with the
# requests' API only (requests.enabled).
"$CONTROLLER_GEN" rbac:roleName=guestbackup-controller-requests paths=./pkg/requeststatus/... \
	output:rbac:dir="$OUT/config/rbac/controller-requests"
"$CONTROLLER_GEN" rbac:roleName=guestbackup-webhook paths=./cmd/webhook/... paths=./pkg/mutate/... paths=./pkg/requests/... \
	output:rbac:dir="$OUT/config/rbac/webhook"
# The server pods of a BSLS with several replicas get this one through a
# RoleBinding the controller writes (kopiaserver.MaintenanceRoleBinding):
# the controller holds bind on it, not the Lease rights themselves.
"$CONTROLLER_GEN" rbac:roleName=guestbackup-server-maintenance paths=./pkg/serverpod/maintenance/... \
	output:rbac:dir="$OUT/config/rbac/server-maintenance"
# Helm reads only files inside the chart (.Files.Get), so the chart carries a
# copy of each role; its templates take the rules from it, and
# verify-generated.sh keeps the copy identical to the markers.
for binary in controller controller-requests webhook server-maintenance; do
	install -m 0644 "$OUT/config/rbac/$binary/role.yaml" "$OUT/charts/guestbackup/files/rbac/$binary-role.yaml"
done

# KubeVirt builds its CRDs, RBAC and webhook configurations at runtime in
# virt-operator; kubevirt-manifests asks virt-operator's own generators, at
# the KubeVirt version the test bed runs (hack/tools/kubevirt/go.mod). Built
# as hack/tools.sh builds that module's commands, so Go's build cache is
# shared; GOSUMDB=off for the same reason as there.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd hack/tools/kubevirt && GOSUMDB=off CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$tmp/kubevirt-manifests" ./kubevirt-manifests)
mkdir -p "$OUT/test/manifests/kubevirt"
"$tmp/kubevirt-manifests" -crds "$OUT/test/crds/kubevirt" \
	-rbac "$OUT/test/manifests/kubevirt/rbac.yaml" -webhooks "$OUT/test/manifests/kubevirt/webhooks.yaml"

# `go list -m` names no folder for a module not yet in the module cache.
go mod download github.com/cert-manager/cert-manager
certmanager="$(go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)"
[[ -d "$certmanager/deploy/crds" ]] || { echo "generate: no CRDs in cert-manager's module at '$certmanager'" >&2; exit 1; }
rm -f "$OUT"/test/crds/cert-manager/*.yaml
install -m 0644 "$certmanager"/deploy/crds/*.yaml "$OUT/test/crds/cert-manager/"

# Velero's module, downloaded outside any module so that go.mod stays free of
# it; `go mod download` checks it against the checksum database. Only the
# BackupStorageLocation CRD is taken: the controller reads no other kind.
velero="$(cd "$tmp" && GOFLAGS= go mod download -json "github.com/vmware-tanzu/velero@$VELERO_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
bslcrd="$velero/config/crd/v1/bases/velero.io_backupstoragelocations.yaml"
[[ -f "$bslcrd" ]] || { echo "generate: no BackupStorageLocation CRD in Velero's module $VELERO_VERSION at '$velero'" >&2; exit 1; }
rm -f "$OUT"/test/crds/velero/*.yaml
install -m 0644 "$bslcrd" "$OUT/test/crds/velero/"
