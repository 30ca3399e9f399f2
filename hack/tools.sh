#!/usr/bin/env bash
# Installs the test bed's tools into a cache outside the work tree, keyed by
# version, so every clone on a machine shares one build of each.
#
#   hack/tools.sh install          build or install whatever is missing (prints timings)
#   hack/tools.sh install-cluster  also KubeVirt's images for the cluster backend
#   hack/tools.sh env              print the environment the tests read (shell syntax)
#
# Go tools are built from the small modules under hack/tools/, which pin their
# versions (the module proxy lists no versions of kopia or kubevirt, so
# `go install pkg@version` is not an option, and MinIO tags no module
# versions at all). Debian packages are installed with apt when missing.
# Azurite (the Azure Blob Storage emulator) is installed from npm, pinned by
# AZURITE_VERSION, into the cache with its dependencies, and runs offline.
# The Linux guest the guest tests boot under qemu is built by
# hack/guest-image.sh (debootstrap), cached by a hash of its recipe.
# GUESTBACKUP_CACHE moves the cache.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/hack/tools"
CACHE="${GUESTBACKUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/guestbackup}"

log() { printf 'tools: %s\n' "$*" >&2; }
die() { printf 'tools: error: %s\n' "$*" >&2; exit 1; }

# modversion DIR MODULE prints the version DIR's go.mod requires of MODULE.
modversion() {
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$TOOLS/$1/go.mod"
}

KUBERNETES_VERSION="$(modversion kube-apiserver k8s.io/kubernetes)"
KOPIA_VERSION="$(modversion kopia github.com/kopia/kopia)"
CONTROLLER_TOOLS_VERSION="$(modversion controller-gen sigs.k8s.io/controller-tools)"
HELM_VERSION="$(modversion helm helm.sh/helm/v3)"
HELM_K8S_VERSION="$(modversion helm k8s.io/client-go)"
KUBECTL_VERSION="$(modversion kubectl k8s.io/kubectl)"
MINIO_VERSION="$(modversion minio github.com/minio/minio)"
KUBEVIRT_VERSION="$(modversion kubevirt kubevirt.io/kubevirt)"
FAKE_GCS_VERSION="$(modversion fake-gcs-server github.com/fsouza/fake-gcs-server)"
# Azurite, the Azure Blob Storage emulator, comes from npm, not the module
# proxy: node and npm must be on PATH (Debian's nodejs and npm).
AZURITE_VERSION=3.37.0
for v in KUBERNETES_VERSION KOPIA_VERSION CONTROLLER_TOOLS_VERSION HELM_VERSION HELM_K8S_VERSION KUBECTL_VERSION MINIO_VERSION KUBEVIRT_VERSION FAKE_GCS_VERSION; do
	[[ -n "${!v}" ]] || die "cannot read $v from hack/tools/*/go.mod"
done

KUBE_APISERVER="$CACHE/kube-apiserver/$KUBERNETES_VERSION/kube-apiserver"
KOPIA="$CACHE/kopia/$KOPIA_VERSION/kopia"
# The same kopia for linux/arm64: server pods hand it to arm64 guests.
KOPIA_ARM64="$CACHE/kopia/$KOPIA_VERSION/kopia-linux-arm64"
CONTROLLER_GEN="$CACHE/controller-gen/$CONTROLLER_TOOLS_VERSION/controller-gen"
HELM="$CACHE/helm/$HELM_VERSION/helm"
KUBECTL="$CACHE/kubectl/$KUBECTL_VERSION/kubectl"
MINIO="$CACHE/minio/$MINIO_VERSION/minio"
# The storage emulators of the Velero gcp and azure specs.
FAKE_GCS="$CACHE/fake-gcs-server/$FAKE_GCS_VERSION/fake-gcs-server"
AZURITE_DIR="$CACHE/azurite/$AZURITE_VERSION"
AZURITE="$AZURITE_DIR/node_modules/azurite/dist/src/blob/main.js"
# KubeVirt's control plane, which the platform's suites run beside the API
# server (internal/testbed.StartKubeVirt).
VIRT_API="$CACHE/kubevirt/$KUBEVIRT_VERSION/virt-api"
VIRT_CONTROLLER="$CACHE/kubevirt/$KUBEVIRT_VERSION/virt-controller"
# The real node (internal/testbed.StartNode): Kubernetes' node and cluster
# components from the same module as kube-apiserver, Debian's containerd,
# runc and CNI plugins, and a pause image of our own (hack/pause) as the
# sandbox image, keyed by a hash of its recipe.
KUBELET="$CACHE/kubelet/$KUBERNETES_VERSION/kubelet"
KUBE_SCHEDULER="$CACHE/kube-scheduler/$KUBERNETES_VERSION/kube-scheduler"
KUBE_CONTROLLER_MANAGER="$CACHE/kube-controller-manager/$KUBERNETES_VERSION/kube-controller-manager"
NODE_DEBS=(containerd runc containernetworking-plugins tini)
PAUSE_IMAGE="$CACHE/pause/$(cat "$ROOT/hack/pause/main.go" "$ROOT/hack/image/main.go" "$ROOT/hack/image/go.sum" | sha256sum | cut -c1-16)/pause.tar"
# envtest looks for kube-apiserver and etcd side by side in one folder.
ASSETS="$CACHE/envtest/$KUBERNETES_VERSION"
# Debian's cloud-init, unpacked, not installed: the version is apt's candidate,
# recorded at install time so `env` needs no apt lookup.
CLOUD_INIT_STAMP="$CACHE/cloud-init/current"
# The Linux guest tests boot under qemu, built by hack/guest-image.sh into a
# folder keyed by a hash of its recipe.
GUEST_IMAGE_ENV=(GUESTBACKUP_CACHE_DIR="$CACHE" GUESTBACKUP_KOPIA="$KOPIA" GUESTBACKUP_KOPIA_VERSION="$KOPIA_VERSION")
GUEST_IMAGE="$(env "${GUEST_IMAGE_ENV[@]}" "$ROOT/hack/guest-image.sh" dir)"
# The stock-like variant: no kopia, nothing of guestbackup's.
GUEST_IMAGE_STOCK="$(env "${GUEST_IMAGE_ENV[@]}" "$ROOT/hack/guest-image.sh" dir stock)"

# KubeVirt itself on the real node (the cluster backend): its images and the
# operator's manifest, built by hack/kubevirt-images.sh from the release
# hack/tools/kubevirt-cluster pins, into a folder keyed by a hash of the recipe.
KUBEVIRT_IMAGES="$(GUESTBACKUP_CACHE_DIR="$CACHE" GUESTBACKUP_GUEST_IMAGE="$GUEST_IMAGE" "$ROOT/hack/kubevirt-images.sh" dir)"
# virt-handler and virt-launcher link libvirt (cgo); KubeVirt's containerDisk
# helper is static C; the images carry file capabilities.
KUBEVIRT_IMAGES_DEBS=(gcc libc6-dev libvirt-dev pkg-config libcap2-bin)

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
	command -v sudo >/dev/null || die "not root and no sudo: cannot install Debian packages"
	SUDO=(sudo)
fi

APT_UPDATED=""
apt_update_once() {
	[[ -n "$APT_UPDATED" ]] && return
	log "apt-get update"
	"${SUDO[@]}" apt-get update -qq >&2
	APT_UPDATED=1
}

# apt_install PKG... installs the Debian packages that are not installed yet.
apt_install() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	apt_update_once
	log "apt-get install ${missing[*]}"
	local out
	if ! out=$("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" 2>&1); then
		printf '%s\n' "$out" >&2
		die "apt-get install ${missing[*]} failed"
	fi
}

# timed NAME CMD... runs CMD and reports how long it took.
timed() {
	local name=$1 start=$SECONDS
	shift
	log "building $name"
	"$@"
	log "built $name in $((SECONDS - start))s"
}

# gobuild CGO DIR OUT PKG [go build flags...] builds PKG inside the tool module
# DIR into OUT with CGO_ENABLED=CGO, atomically, so an interrupted build never
# leaves a broken binary behind.
gobuild() {
	local cgo=$1 dir=$2 out=$3 pkg=$4
	shift 4
	mkdir -p "$(dirname "$out")"
	(cd "$TOOLS/$dir" && CGO_ENABLED=$cgo GOFLAGS=-mod=readonly go build -trimpath "$@" -o "$out.tmp" "$pkg")
	mv -f "$out.tmp" "$out"
}

# kube_ldflags prints the version stamp of Kubernetes' own release builds.
kube_ldflags() {
	local v=k8s.io/component-base/version major minor
	major=$(cut -d. -f1 <<<"${KUBERNETES_VERSION#v}")
	minor=$(cut -d. -f2 <<<"$KUBERNETES_VERSION")
	echo "-X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
}

install_go_tools() {
	# Stamped with its version as Kubernetes' own build does: clients read
	# /version (helm checks a chart's kubeVersion against it), and an
	# unstamped build says v0.0.0. A binary from before the stamp is rebuilt
	# (only its link step, when Go's build cache is warm). The real node's
	# kubelet, scheduler and controller manager come from the same module
	# (internal/testbed.StartNode); with kube-apiserver's packages in Go's
	# build cache they take about a minute each.
	local cmd bin
	for cmd in kube-apiserver kubelet kube-scheduler kube-controller-manager; do
		bin="$CACHE/$cmd/$KUBERNETES_VERSION/$cmd"
		[[ "$("$bin" --version 2>/dev/null)" == "Kubernetes $KUBERNETES_VERSION" ]] && continue
		[[ $cmd == kube-apiserver ]] && log "kube-apiserver takes about 7 minutes on 2 cores when nothing is cached"
		timed "$cmd $KUBERNETES_VERSION" gobuild 1 kube-apiserver "$bin" "k8s.io/kubernetes/cmd/$cmd" -ldflags "$(kube_ldflags)"
	done
	# Static, so the same binary runs in the server image and in test guests.
	[[ -x "$KOPIA" ]] || timed "kopia $KOPIA_VERSION" \
		gobuild 0 kopia "$KOPIA" github.com/kopia/kopia
	[[ -s "$KOPIA_ARM64" ]] || GOARCH=arm64 timed "kopia $KOPIA_VERSION linux/arm64" \
		gobuild 0 kopia "$KOPIA_ARM64" github.com/kopia/kopia
	[[ -x "$CONTROLLER_GEN" ]] || timed "controller-gen $CONTROLLER_TOOLS_VERSION" \
		gobuild 1 controller-gen "$CONTROLLER_GEN" sigs.k8s.io/controller-tools/cmd/controller-gen
	if [[ ! -x "$HELM" ]]; then
		# Without these helm believes the cluster is Kubernetes 1.20 and
		# refuses charts that declare a newer kubeVersion.
		local major minor ldflags
		major=$(( $(cut -d. -f1 <<<"${HELM_K8S_VERSION#v}") + 1 ))
		minor=$(cut -d. -f2 <<<"$HELM_K8S_VERSION")
		ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
		for p in pkg/chartutil pkg/lint/rules; do
			ldflags+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=$major -X helm.sh/helm/v3/$p.k8sVersionMinor=$minor"
		done
		timed "helm $HELM_VERSION" gobuild 0 helm "$HELM" helm.sh/helm/v3/cmd/helm -ldflags "$ldflags"
	fi
	# The README's quick start runs in the chart's test with the user's CLI.
	if [[ ! -x "$KUBECTL" ]]; then
		local kv=k8s.io/component-base/version kmajor kminor
		kmajor=$(( $(cut -d. -f1 <<<"${KUBECTL_VERSION#v}") + 1 ))
		kminor=$(cut -d. -f2 <<<"$KUBECTL_VERSION")
		timed "kubectl $KUBECTL_VERSION" gobuild 0 kubectl "$KUBECTL" . \
			-ldflags "-s -w -X $kv.gitVersion=v$kmajor.$kminor.${KUBECTL_VERSION##*.} -X $kv.gitMajor=$kmajor -X $kv.gitMinor=$kminor"
	fi
	# The S3 endpoint of the S3 and Velero specs. MinIO tags no module
	# versions, so it is pinned by pseudo-version.
	if [[ ! -x "$MINIO" ]]; then
		log "minio takes about 4 minutes on 2 cores when nothing is cached"
		timed "minio $MINIO_VERSION" gobuild 0 minio "$MINIO" github.com/minio/minio
	fi
	# The Google Cloud Storage endpoint of the Velero gcp specs.
	[[ -x "$FAKE_GCS" ]] || timed "fake-gcs-server $FAKE_GCS_VERSION" \
		gobuild 0 fake-gcs-server "$FAKE_GCS" github.com/fsouza/fake-gcs-server
	# GOSUMDB=off: one of KubeVirt's dependencies
	# (rhobs/operator-observability-toolkit) is missing from the checksum
	# database; go.sum still pins every module's hash.
	if [[ ! -x "$VIRT_API" || ! -x "$VIRT_CONTROLLER" ]]; then
		log "virt-api and virt-controller take about 3 minutes on 2 cores when nothing is cached"
		GOSUMDB=off timed "virt-api $KUBEVIRT_VERSION" gobuild 0 kubevirt "$VIRT_API" kubevirt.io/kubevirt/cmd/virt-api
		GOSUMDB=off timed "virt-controller $KUBEVIRT_VERSION" gobuild 0 kubevirt "$VIRT_CONTROLLER" kubevirt.io/kubevirt/cmd/virt-controller
	fi
}

# install_azurite installs the Azure Blob Storage emulator of the Velero azure
# specs from npm into the cache, with its dependencies: it then runs offline.
install_azurite() {
	[[ -s "$AZURITE" ]] && return
	command -v npm >/dev/null || apt_install nodejs npm
	rm -rf "$AZURITE_DIR.tmp" && mkdir -p "$AZURITE_DIR.tmp"
	timed "azurite $AZURITE_VERSION" npm install --silent --no-audit --no-fund --omit=dev \
		--prefix "$AZURITE_DIR.tmp" "azurite@$AZURITE_VERSION" >&2
	rm -rf "$AZURITE_DIR" && mv "$AZURITE_DIR.tmp" "$AZURITE_DIR"
}

install_etcd() {
	apt_install etcd-server
	mkdir -p "$ASSETS"
	ln -sfn "$KUBE_APISERVER" "$ASSETS/kube-apiserver"
	ln -sfn "$(command -v etcd || echo /usr/bin/etcd)" "$ASSETS/etcd"
	"$ASSETS/etcd" --version >/dev/null || die "etcd from etcd-server does not run"
}

# Packages that cloud-init's schema validation imports. Without jsonschema it
# silently calls every document valid, which is why the tests keep a known-bad
# sample.
CLOUD_INIT_DEBS=(cloud-init python3-requests python3-urllib3 python3-idna python3-certifi
	python3-charset-normalizer python3-chardet python3-configobj python3-jsonpatch
	python3-json-pointer python3-jsonschema python3-attr python3-pyrsistent python3-yaml)

install_cloud_init() {
	apt_install python3 python3-minimal
	if [[ -s "$CLOUD_INIT_STAMP" && -x "$(cat "$CLOUD_INIT_STAMP")/cloud-init-schema" ]]; then
		return
	fi
	apt_update_once
	local version dir tmp
	version=$(apt-cache policy cloud-init | awk '/Candidate:/ { print $2 }')
	[[ -n "$version" && "$version" != "(none)" ]] || die "apt has no cloud-init candidate"
	dir="$CACHE/cloud-init/$version"
	local start=$SECONDS
	log "unpacking Debian cloud-init $version (not installed system-wide)"
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt's sandbox user downloads into it
	(cd "$tmp" && apt-get download -qq "${CLOUD_INIT_DEBS[@]}" >&2)
	rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/root"
	for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$dir.tmp/root"; done
	rm -rf "$tmp"
	cat >"$dir.tmp/cloud-init-schema" <<'EOF'
#!/bin/sh
# Validates cloud-config files with Debian's cloud-init, unpacked beside this script.
here=$(dirname "$(readlink -f "$0")")
PYTHONPATH="$here/root/usr/lib/python3/dist-packages" exec /usr/bin/python3 "$here/root/usr/bin/cloud-init" schema "$@"
EOF
	chmod +x "$dir.tmp/cloud-init-schema"
	rm -rf "$dir" && mv "$dir.tmp" "$dir"
	echo "$dir" >"$CLOUD_INIT_STAMP"
	log "unpacked cloud-init in $((SECONDS - start))s"
}

# The guest scripts' linters. checkbashisms is one Perl script of Debian's
# devscripts, whose dependencies (dpkg-dev, gnupg, libwww-perl...) the test
# bed does not need: it is unpacked from the .deb, as cloud-init is, and run
# with the system's perl.
CHECKBASHISMS_STAMP="$CACHE/checkbashisms/current"
CHECKBASHISMS=""
[[ -s "$CHECKBASHISMS_STAMP" ]] && CHECKBASHISMS="$(cat "$CHECKBASHISMS_STAMP")"

install_shell_linters() {
	apt_install shellcheck perl
	[[ -n "$CHECKBASHISMS" && -x "$CHECKBASHISMS" ]] && return
	apt_update_once
	local version dir tmp
	version=$(apt-cache policy devscripts | awk '/Candidate:/ { print $2 }')
	[[ -n "$version" && "$version" != "(none)" ]] || die "apt has no devscripts candidate"
	dir="$CACHE/checkbashisms/$version"
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt's sandbox user downloads into it
	(cd "$tmp" && apt-get download -qq devscripts >&2)
	dpkg-deb -x "$tmp"/devscripts_*.deb "$tmp/root"
	mkdir -p "$dir"
	install -m 0755 "$tmp/root/usr/bin/checkbashisms" "$dir/checkbashisms.tmp"
	mv -f "$dir/checkbashisms.tmp" "$dir/checkbashisms"
	rm -rf "$tmp"
	CHECKBASHISMS="$dir/checkbashisms"
	echo "$CHECKBASHISMS" >"$CHECKBASHISMS_STAMP"
	log "unpacked checkbashisms from devscripts $version"
}

# Host side of the guest: qemu and the tools that build its image and disks.
GUEST_DEBS=(qemu-system-x86 qemu-utils debootstrap xorriso e2fsprogs zstd)

install_guest_image() {
	apt_install "${GUEST_DEBS[@]}"
	[[ -s "$GUEST_IMAGE/root.img" ]] ||
		timed "guest image $(basename "$GUEST_IMAGE")" env "${GUEST_IMAGE_ENV[@]}" "$ROOT/hack/guest-image.sh" build
	[[ -s "$GUEST_IMAGE_STOCK/root.img" ]] ||
		timed "guest image $(basename "$GUEST_IMAGE_STOCK")" env "${GUEST_IMAGE_ENV[@]}" "$ROOT/hack/guest-image.sh" build stock
}

install_node() {
	apt_install "${NODE_DEBS[@]}"
	[[ -s "$PAUSE_IMAGE" ]] && return
	local work
	work=$(mktemp -d)
	(cd "$ROOT" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags=-s -o "$work/pause" ./hack/pause)
	mkdir -p "$(dirname "$PAUSE_IMAGE")"
	(cd "$ROOT/hack/image" && GOFLAGS=-mod=readonly go run . -out "$work/pause.tar" -tag guestbackup.local/pause:1 \
		-file "/usr/local/bin/pause=$work/pause" -entrypoint /usr/local/bin/pause -user 65535:65535)
	mv -f "$work/pause.tar" "$PAUSE_IMAGE"
	rm -rf "$work"
	log "built the pause image $PAUSE_IMAGE"
}

install_kubevirt_images() {
	apt_install "${GUEST_DEBS[@]}" "${KUBEVIRT_IMAGES_DEBS[@]}"
	GUESTBACKUP_CACHE_DIR="$CACHE" GUESTBACKUP_GUEST_IMAGE="$GUEST_IMAGE" "$ROOT/hack/kubevirt-images.sh" build
}

print_env() {
	local ci=""
	[[ -s "$CLOUD_INIT_STAMP" ]] && ci="$(cat "$CLOUD_INIT_STAMP")/cloud-init-schema"
	cat <<EOF
export KUBEBUILDER_ASSETS=$ASSETS
export GUESTBACKUP_KOPIA=$KOPIA
export GUESTBACKUP_KOPIA_ARM64=$KOPIA_ARM64
export GUESTBACKUP_SHELLCHECK=$(command -v shellcheck || echo /usr/bin/shellcheck)
export GUESTBACKUP_CHECKBASHISMS=$CHECKBASHISMS
export GUESTBACKUP_CONTROLLER_GEN=$CONTROLLER_GEN
export GUESTBACKUP_HELM=$HELM
export GUESTBACKUP_KUBECTL=$KUBECTL
export GUESTBACKUP_MINIO=$MINIO
export GUESTBACKUP_FAKE_GCS=$FAKE_GCS
export GUESTBACKUP_AZURITE=$AZURITE
export GUESTBACKUP_CLOUD_INIT_SCHEMA=$ci
export GUESTBACKUP_GUEST_IMAGE=$GUEST_IMAGE
export GUESTBACKUP_GUEST_IMAGE_STOCK=$GUEST_IMAGE_STOCK
export GUESTBACKUP_VIRT_API=$VIRT_API
export GUESTBACKUP_VIRT_CONTROLLER=$VIRT_CONTROLLER
export GUESTBACKUP_KUBELET=$KUBELET
export GUESTBACKUP_KUBE_SCHEDULER=$KUBE_SCHEDULER
export GUESTBACKUP_KUBE_CONTROLLER_MANAGER=$KUBE_CONTROLLER_MANAGER
export GUESTBACKUP_PAUSE_IMAGE=$PAUSE_IMAGE
export GUESTBACKUP_KUBEVIRT_IMAGES=$KUBEVIRT_IMAGES
EOF
}

case "${1:-install}" in
install)
	mkdir -p "$CACHE/cloud-init" "$CACHE/checkbashisms"
	command -v go >/dev/null || die "go is not on PATH (Go 1.26 is required)"
	start=$SECONDS
	install_go_tools
	install_etcd
	install_azurite
	install_cloud_init
	install_shell_linters
	install_guest_image
	install_node
	log "tools ready in $CACHE ($((SECONDS - start))s)"
	;;
install-cluster)
	start=$SECONDS
	install_kubevirt_images
	log "KubeVirt's images ready in $KUBEVIRT_IMAGES ($((SECONDS - start))s)"
	;;
env) print_env ;;
*) die "usage: $0 [install|install-cluster|env]" ;;
esac
