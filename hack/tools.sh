#!/usr/bin/env bash
# Installs the test bed's tools into a cache outside the work tree, keyed by
# version, so every clone on a machine shares one build of each.
#
#   hack/tools.sh install [TOOL|SET...]  build or install what is missing of them
#                                        (default: all); prints a plan, progress and timings
#   hack/tools.sh install-cluster        KubeVirt's images for the cluster backend (and what they need)
#   hack/tools.sh plan [TOOL|SET...]     print what install would build, and roughly how long it takes
#   hack/tools.sh list                   the tools and sets, what each is for, and whether it is built
#   hack/tools.sh step NAME SECONDS CMD...  run another long build as these are run (its log, a line a minute)
#   hack/tools.sh expand TOOL|SET...     print the tools named, sets expanded and prerequisites added
#   hack/tools.sh env [TOOL|SET...]      print the environment the tests read (shell syntax); given
#                                        names, every other tool points at a path that says it is not granted
#
# Tools: apiserver kopia kopia-arm64 controller-gen helm kubectl minio
# fake-gcs azurite kubevirt cloud-init linters guest guest-stock node cluster.
# Sets: all (every tool but cluster), demo (what `make demo` runs),
# demo-node and demo-cluster (what its -node and -cluster modes run), none.
#
# Go tools are built from the small modules under hack/tools/, which pin their
# versions (the module proxy lists no versions of kopia or kubevirt, so
# `go install pkg@version` is not an option, and MinIO tags no module
# versions at all). Debian packages are installed with apt when missing.
# Azurite (the Azure Blob Storage emulator) is installed from npm, pinned by
# AZURITE_VERSION, into the cache with its dependencies, and runs offline.
# The Linux guests the guest tests boot under qemu are built by
# hack/guest-image.sh (debootstrap), cached by a hash of their recipe.
#
# Two lanes run at once: the Go builds, which keep both cores busy, and the
# steps that mostly wait on the network and the disk (apt, debootstrap, npm).
# Each step's output goes to a log file of its own under the cache's logs/
# folder, named when the step fails; the terminal gets one line per step
# and one a minute while a step runs. GUESTBACKUP_CACHE moves the cache;
# GUESTBACKUP_TIMINGS names a file that gets a "tools/<step> <seconds>" line
# per step built (make test's breakdown reads it).
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
PAUSE_IMAGE="$CACHE/pause/$(cat "$ROOT/hack/pause/main.go" "$ROOT/hack/image/main.go" "$ROOT/hack/image/go.sum" | sha256sum | cut -c1-16)/pause.tar"
# envtest looks for kube-apiserver and etcd side by side in one folder.
ASSETS="$CACHE/envtest/$KUBERNETES_VERSION"
# Debian's cloud-init, unpacked, not installed: the version is apt's candidate,
# recorded at install time so `env` needs no apt lookup.
CLOUD_INIT_STAMP="$CACHE/cloud-init/current"
# The guest scripts' linters. checkbashisms is one Perl script of Debian's
# devscripts, whose dependencies (dpkg-dev, gnupg, libwww-perl...) the test
# bed does not need: it is unpacked from the .deb, as cloud-init is, and run
# with the system's perl.
CHECKBASHISMS_STAMP="$CACHE/checkbashisms/current"
CHECKBASHISMS=""
[[ -s "$CHECKBASHISMS_STAMP" ]] && CHECKBASHISMS="$(cat "$CHECKBASHISMS_STAMP")"
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

# The tools, in the order a full install builds them.
# Each lane (see lane) takes them in this order: kopia first, which the test
# guest carries, and the long debootstraps first in theirs.
ALL_TOOLS=(kopia apiserver kubevirt controller-gen kopia-arm64 node helm kubectl minio fake-gcs
	guest-stock guest cloud-init linters azurite)

# describe TOOL prints what TOOL is, for the plan.
describe() {
	case $1 in
	apiserver) echo "kube-apiserver $KUBERNETES_VERSION and etcd (the API server of every envtest suite)" ;;
	kopia) echo "kopia $KOPIA_VERSION" ;;
	kopia-arm64) echo "kopia $KOPIA_VERSION for linux/arm64 (server pods hand it to arm64 guests)" ;;
	controller-gen) echo "controller-gen $CONTROLLER_TOOLS_VERSION" ;;
	helm) echo "helm $HELM_VERSION" ;;
	kubectl) echo "kubectl $KUBECTL_VERSION" ;;
	minio) echo "MinIO (the S3 endpoint)" ;;
	fake-gcs) echo "fake-gcs-server $FAKE_GCS_VERSION (Google Cloud Storage)" ;;
	azurite) echo "Azurite $AZURITE_VERSION (Azure Blob Storage, from npm)" ;;
	kubevirt) echo "KubeVirt $KUBEVIRT_VERSION's virt-api and virt-controller" ;;
	cloud-init) echo "Debian's cloud-init (schema validation), unpacked" ;;
	linters) echo "shellcheck and checkbashisms" ;;
	guest) echo "the test guest image (Debian with kopia; debootstrap)" ;;
	guest-stock) echo "the stock-like guest image (Debian without kopia; debootstrap)" ;;
	node) echo "the real node: kubelet, kube-scheduler, kube-controller-manager, containerd, the pause image" ;;
	cluster) echo "KubeVirt $(modversion kubevirt-cluster kubevirt.io/kubevirt)'s images for the cluster backend (virt-operator, virt-api, virt-controller, virt-handler, virt-launcher)" ;;
	*) return 1 ;;
	esac
}

# estimate TOOL prints the seconds TOOL took to build on a 2-core machine
# with empty caches (Go's module and build caches included), measured with
# this script's own timings in a cold make demo, then make test, on
# 2026-12-06, in this order: kopia, apiserver, kubevirt, kopia-arm64, then
# the rest (kopia includes the downloads the later Go builds share, and each
# Go build reuses what the ones before it compiled); a warm Go build cache
# makes most much shorter. helm, kubectl and node are rounded up from their
# builds into that run's cache once they shared its settings (27 s, 37 s,
# and 44 s for the kubelet, which the node's other commands follow), not
# yet from a cold run.
estimate() {
	case $1 in
	apiserver) echo 185 ;;
	kopia) echo 130 ;;
	kopia-arm64) echo 75 ;;
	controller-gen) echo 35 ;;
	helm) echo 40 ;;
	kubectl) echo 45 ;;
	minio) echo 110 ;;
	fake-gcs) echo 35 ;;
	azurite) echo 45 ;;
	kubevirt) echo 90 ;;
	cloud-init) echo 15 ;;
	linters) echo 10 ;;
	guest) echo 135 ;;
	guest-stock) echo 135 ;;
	node) echo 150 ;;
	cluster) echo 525 ;;
	*) echo 60 ;;
	esac
}

# lane TOOL prints "go" for the builds that keep the cores busy, "io" for
# those that mostly wait on the network and the disk.
lane() {
	case $1 in
	cloud-init | linters | azurite | guest | guest-stock) echo io ;;
	*) echo go ;;
	esac
}

# expand_tools TOOL|SET... prints the tools named, sets expanded and each tool's
# prerequisites added, in ALL_TOOLS' order.
expand_tools() {
	local -A want=()
	local a
	for a in "$@"; do
		case $a in
		all) for t in "${ALL_TOOLS[@]}"; do want[$t]=1; done ;;
		none) ;;
		# hack/demo's local mode: the API server, KubeVirt's control plane,
		# the server pod (kopia for both architectures) and the stock guest.
		demo) for t in apiserver kubevirt kopia kopia-arm64 guest-stock; do want[$t]=1; done ;;
		# hack/demo -node: helm installs the chart on the real node, whose
		# image carries kopia for both architectures.
		demo-node) for t in apiserver kopia kopia-arm64 helm node; do want[$t]=1; done ;;
		# hack/demo -cluster: helm installs the chart on the real node, the
		# product's image carries kopia for both architectures, and KubeVirt's
		# images pack the test guest.
		demo-cluster) for t in apiserver kopia kopia-arm64 helm node guest cluster; do want[$t]=1; done ;;
		*) describe "$a" >/dev/null || die "unknown tool or set $a (hack/tools.sh list names them)"; want[$a]=1 ;;
		esac
	done
	# The test guest carries kopia; KubeVirt's images pack the test guest.
	[[ -n "${want[cluster]:-}" ]] && want[guest]=1
	[[ -n "${want[guest]:-}" ]] && want[kopia]=1
	for t in "${ALL_TOOLS[@]}" cluster; do
		[[ -n "${want[$t]:-}" ]] && echo "$t"
	done
	return 0
}

# debs TOOL prints the Debian packages TOOL needs.
debs() {
	case $1 in
	apiserver) echo etcd-server ;;
	cloud-init) echo python3 python3-minimal ;;
	linters) echo shellcheck perl ;;
	azurite) command -v npm >/dev/null || echo nodejs npm ;;
	guest | guest-stock) echo qemu-system-x86 qemu-utils debootstrap xorriso e2fsprogs zstd ;;
	node) echo containerd runc containernetworking-plugins tini ;;
	# virt-handler and virt-launcher link libvirt (cgo); KubeVirt's
	# containerDisk helper is static C; the images carry file capabilities.
	cluster) echo qemu-system-x86 qemu-utils debootstrap xorriso e2fsprogs zstd gcc libc6-dev libvirt-dev pkg-config libcap2-bin ;;
	esac
}

deb_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }

# built TOOL succeeds when TOOL is ready in the cache (and its Debian
# packages installed).
built() {
	local p
	for p in $(debs "$1"); do deb_installed "$p" || return 1; done
	case $1 in
	apiserver)
		# Stamped with its version (see build_kube): an unstamped build is rebuilt.
		[[ "$("$KUBE_APISERVER" --version 2>/dev/null)" == "Kubernetes $KUBERNETES_VERSION" && -x "$ASSETS/etcd" && -x "$ASSETS/kube-apiserver" ]] ;;
	kopia) [[ -x "$KOPIA" ]] ;;
	kopia-arm64) [[ -s "$KOPIA_ARM64" ]] ;;
	controller-gen) [[ -x "$CONTROLLER_GEN" ]] ;;
	helm) [[ -x "$HELM" ]] ;;
	kubectl) [[ -x "$KUBECTL" ]] ;;
	minio) [[ -x "$MINIO" ]] ;;
	fake-gcs) [[ -x "$FAKE_GCS" ]] ;;
	azurite) [[ -s "$AZURITE" ]] ;;
	kubevirt) [[ -x "$VIRT_API" && -x "$VIRT_CONTROLLER" ]] ;;
	cloud-init) [[ -s "$CLOUD_INIT_STAMP" && -x "$(cat "$CLOUD_INIT_STAMP")/cloud-init-schema" ]] ;;
	linters) [[ -n "$CHECKBASHISMS" && -x "$CHECKBASHISMS" ]] ;;
	guest) [[ -s "$GUEST_IMAGE/root.img" ]] ;;
	guest-stock) [[ -s "$GUEST_IMAGE_STOCK/root.img" ]] ;;
	node)
		local cmd
		for cmd in kubelet kube-scheduler kube-controller-manager; do
			[[ "$("$CACHE/$cmd/$KUBERNETES_VERSION/$cmd" --version 2>/dev/null)" == "Kubernetes $KUBERNETES_VERSION" ]] || return 1
		done
		[[ -s "$PAUSE_IMAGE" ]] ;;
	cluster) [[ -s "$KUBEVIRT_IMAGES/kubevirt-operator.yaml" ]] ;;
	esac
}

SUDO=()
APT_UPDATED=""
apt_update_once() {
	[[ -n "$APT_UPDATED" ]] && return
	# The lanes are subshells: the state folder tells them too.
	[[ -n "$STATE" && -e "$STATE/apt-updated" ]] && return
	echo "apt-get update"
	"${SUDO[@]}" apt-get update -qq || die "apt-get update failed: is Debian's archive reachable?"
	APT_UPDATED=1
	[[ -z "$STATE" ]] || touch "$STATE/apt-updated"
}

# apt_install PKG... installs the Debian packages that are not installed yet.
apt_install() {
	local missing=() p
	for p in "$@"; do
		deb_installed "$p" || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	apt_update_once
	echo "apt-get install ${missing[*]}"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
		die "apt-get install ${missing[*]} failed"
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

# build_kube CMD builds one of Kubernetes' commands unless the cache holds it
# stamped with its version, as Kubernetes' own build stamps it: clients read
# /version (helm checks a chart's kubeVersion against it), and an unstamped
# build says v0.0.0. A binary from before the stamp is rebuilt (only its link
# step, when Go's build cache is warm). The node's commands come from the same
# module as kube-apiserver: with its packages in Go's build cache they take
# about a minute each. All are static, as the test binaries and the demo
# are (the Makefile exports CGO_ENABLED=0 and -trimpath), so Go's build
# cache compiles the packages they share once. Kubernetes' release links
# them static too, the kubelet aside (KUBE_STATIC_BINARIES in its
# hack/lib/golang.sh), whose cgo buys nothing here (the node's DNS and users
# are the host's files, which Go reads itself) and cost a compile of its
# own: 278 s for the node's commands cold, against 44 s for a static kubelet
# after kube-apiserver.
build_kube() {
	local bin="$CACHE/$1/$KUBERNETES_VERSION/$1"
	[[ "$("$bin" --version 2>/dev/null)" == "Kubernetes $KUBERNETES_VERSION" ]] && return
	gobuild 0 kube-apiserver "$bin" "k8s.io/kubernetes/cmd/$1" -ldflags "$(kube_ldflags)"
}

# The build of each tool; each runs with its output in the step's log.
build_apiserver() {
	# etcd-server came with the Debian packages installed before the lanes.
	build_kube kube-apiserver
	mkdir -p "$ASSETS"
	ln -sfn "$KUBE_APISERVER" "$ASSETS/kube-apiserver"
	ln -sfn "$(command -v etcd || echo /usr/bin/etcd)" "$ASSETS/etcd"
	"$ASSETS/etcd" --version >/dev/null || die "etcd from etcd-server does not run"
}

# Static, so the same binary runs in the server image and in test guests.
build_kopia() { gobuild 0 kopia "$KOPIA" github.com/kopia/kopia; }
build_kopia-arm64() { GOARCH=arm64 gobuild 0 kopia "$KOPIA_ARM64" github.com/kopia/kopia; }
build_controller-gen() { gobuild 1 controller-gen "$CONTROLLER_GEN" sigs.k8s.io/controller-tools/cmd/controller-gen; }

build_helm() {
	# Without these helm believes the cluster is Kubernetes 1.20 and
	# refuses charts that declare a newer kubeVersion.
	local major minor ldflags p
	major=$(($(cut -d. -f1 <<<"${HELM_K8S_VERSION#v}") + 1))
	minor=$(cut -d. -f2 <<<"$HELM_K8S_VERSION")
	ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
	for p in pkg/chartutil pkg/lint/rules; do
		ldflags+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=$major -X helm.sh/helm/v3/$p.k8sVersionMinor=$minor"
	done
	gobuild 0 helm "$HELM" helm.sh/helm/v3/cmd/helm -ldflags "$ldflags"
}

# The README's quick start runs in the chart's test with the user's CLI.
build_kubectl() {
	local kv=k8s.io/component-base/version kmajor kminor
	kmajor=$(($(cut -d. -f1 <<<"${KUBECTL_VERSION#v}") + 1))
	kminor=$(cut -d. -f2 <<<"$KUBECTL_VERSION")
	gobuild 0 kubectl "$KUBECTL" . \
		-ldflags "-s -w -X $kv.gitVersion=v$kmajor.$kminor.${KUBECTL_VERSION##*.} -X $kv.gitMajor=$kmajor -X $kv.gitMinor=$kminor"
}

# The S3 endpoint of the S3 and Velero specs. MinIO tags no module versions,
# so it is pinned by pseudo-version.
build_minio() { gobuild 0 minio "$MINIO" github.com/minio/minio; }
# The Google Cloud Storage endpoint of the Velero gcp specs.
build_fake-gcs() { gobuild 0 fake-gcs-server "$FAKE_GCS" github.com/fsouza/fake-gcs-server; }

# GOSUMDB=off: one of KubeVirt's dependencies
# (rhobs/operator-observability-toolkit) is missing from the checksum
# database; go.sum still pins every module's hash.
build_kubevirt() {
	GOSUMDB=off gobuild 0 kubevirt "$VIRT_API" kubevirt.io/kubevirt/cmd/virt-api
	GOSUMDB=off gobuild 0 kubevirt "$VIRT_CONTROLLER" kubevirt.io/kubevirt/cmd/virt-controller
}

# The Azure Blob Storage emulator of the Velero azure specs, from npm into
# the cache with its dependencies: it then runs offline.
build_azurite() {
	rm -rf "$AZURITE_DIR.tmp" && mkdir -p "$AZURITE_DIR.tmp"
	npm install --silent --no-audit --no-fund --omit=dev --prefix "$AZURITE_DIR.tmp" "azurite@$AZURITE_VERSION"
	rm -rf "$AZURITE_DIR" && mv "$AZURITE_DIR.tmp" "$AZURITE_DIR"
}

# Packages that cloud-init's schema validation imports. Without jsonschema it
# silently calls every document valid, which is why the tests keep a known-bad
# sample.
CLOUD_INIT_DEBS=(cloud-init python3-requests python3-urllib3 python3-idna python3-certifi
	python3-charset-normalizer python3-chardet python3-configobj python3-jsonpatch
	python3-json-pointer python3-jsonschema python3-attr python3-pyrsistent python3-yaml)

build_cloud-init() {
	apt_update_once
	local version dir tmp deb
	version=$(apt-cache policy cloud-init | awk '/Candidate:/ { print $2 }')
	[[ -n "$version" && "$version" != "(none)" ]] || die "apt has no cloud-init candidate"
	dir="$CACHE/cloud-init/$version"
	echo "unpacking Debian cloud-init $version (not installed system-wide)"
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt's sandbox user downloads into it
	(cd "$tmp" && apt-get download -qq "${CLOUD_INIT_DEBS[@]}")
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
	mkdir -p "$(dirname "$CLOUD_INIT_STAMP")"
	echo "$dir" >"$CLOUD_INIT_STAMP"
}

build_linters() {
	apt_update_once
	local version dir tmp
	version=$(apt-cache policy devscripts | awk '/Candidate:/ { print $2 }')
	[[ -n "$version" && "$version" != "(none)" ]] || die "apt has no devscripts candidate"
	dir="$CACHE/checkbashisms/$version"
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt's sandbox user downloads into it
	(cd "$tmp" && apt-get download -qq devscripts)
	dpkg-deb -x "$tmp"/devscripts_*.deb "$tmp/root"
	mkdir -p "$dir"
	install -m 0755 "$tmp/root/usr/bin/checkbashisms" "$dir/checkbashisms.tmp"
	mv -f "$dir/checkbashisms.tmp" "$dir/checkbashisms"
	rm -rf "$tmp"
	CHECKBASHISMS="$dir/checkbashisms"
	mkdir -p "$(dirname "$CHECKBASHISMS_STAMP")"
	echo "$CHECKBASHISMS" >"$CHECKBASHISMS_STAMP"
}

build_guest() { env "${GUEST_IMAGE_ENV[@]}" "$ROOT/hack/guest-image.sh" build; }
build_guest-stock() { env "${GUEST_IMAGE_ENV[@]}" "$ROOT/hack/guest-image.sh" build stock; }

build_node() {
	local cmd work
	for cmd in kubelet kube-scheduler kube-controller-manager; do build_kube "$cmd"; done
	[[ -s "$PAUSE_IMAGE" ]] && return
	work=$(mktemp -d)
	(cd "$ROOT" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags=-s -o "$work/pause" ./hack/pause)
	mkdir -p "$(dirname "$PAUSE_IMAGE")"
	(cd "$ROOT/hack/image" && GOFLAGS=-mod=readonly go run . -out "$work/pause.tar" -tag guestbackup.local/pause:1 \
		-file "/usr/local/bin/pause=$work/pause" -entrypoint /usr/local/bin/pause -user 65535:65535)
	mv -f "$work/pause.tar" "$PAUSE_IMAGE"
	rm -rf "$work"
}

build_cluster() {
	GUESTBACKUP_CACHE_DIR="$CACHE" GUESTBACKUP_GUEST_IMAGE="$GUEST_IMAGE" "$ROOT/hack/kubevirt-images.sh" build
}

# check_prerequisites TOOL... fails, before any long build, on what would
# make one of TOOL's builds fail later: Go and its version, root or sudo for
# apt and debootstrap, and free disk space.
check_prerequisites() {
	local t needs_root="" need_mb=0 p images=""
	command -v go >/dev/null || die "go is not on PATH: install Go $(go_wanted) or later (https://go.dev/doc/install) and put its bin folder on PATH"
	local have want
	have=$(go env GOVERSION)
	want=$(go_wanted)
	if [[ "$(printf '%s\n' "go$want" "$have" | sort -V | head -n 1)" != "go$want" ]]; then
		die "$have is too old: the tools' modules need go $want or later (GOTOOLCHAIN cannot download one here)"
	fi
	for t in "$@"; do
		for p in $(debs "$t"); do deb_installed "$p" || needs_root=1; done
		case $t in
		guest | guest-stock | cluster) images+=" $t" ;;
		# apt-get update and download, for the .debs they unpack.
		cloud-init | linters) needs_root=1 ;;
		esac
		need_mb=$((need_mb + $(disk_mb "$t")))
	done
	# hack/guest-image.sh and hack/kubevirt-images.sh run debootstrap and
	# chroot themselves.
	if [[ -n "$images" && $(id -u) -ne 0 ]]; then
		die "building$images needs root (debootstrap, chroot, file ownership in the images): run it as root"
	fi
	if [[ -n "$needs_root" && $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || die "not root and no sudo: installing Debian packages and building guest images (debootstrap, chroot) need root; run as root, or install sudo"
		sudo -n true 2>/dev/null || log "sudo will ask for a password: apt and debootstrap run as root"
		SUDO=(sudo)
	fi
	if [[ -n "$needs_root" ]]; then
		command -v apt-get >/dev/null || die "no apt-get: the test bed installs its Debian 12 packages with apt (qemu, etcd, debootstrap...); run it on Debian 12 or a derivative"
	fi
	mkdir -p "$CACHE"
	local free_mb
	free_mb=$(df -Pm "$CACHE" | awk 'NR == 2 { print $4 }')
	if ((free_mb < need_mb)); then
		die "$CACHE has ${free_mb} MiB free; these tools need about ${need_mb} MiB there and in Go's caches: free some space, or move the cache with GUESTBACKUP_CACHE"
	fi
}

# go_wanted prints the highest Go version the tool modules declare.
go_wanted() { awk '$1 == "go" { print $2 }' "$TOOLS"/*/go.mod "$ROOT/go.mod" | sort -V | tail -n 1; }

# disk_mb TOOL prints roughly how much disk TOOL's build takes, Go's caches
# included.
disk_mb() {
	case $1 in
	apiserver | node | minio | kubevirt) echo 2500 ;;
	guest | guest-stock) echo 1500 ;;
	cluster) echo 6000 ;;
	*) echo 500 ;;
	esac
}

# minutes SECONDS prints a rounded duration for a person.
minutes() {
	if (($1 < 90)); then echo "$1 s"; else echo "$((($1 + 30) / 60)) min"; fi
}

STATE=""
LOGS=""

# children PID prints PID's child processes (procps' pgrep may be missing).
children() { cat /proc/"$1"/task/*/children 2>/dev/null || true; }

# kill_tree PID stops PID and every process it started, parents first so
# that none starts another meanwhile.
kill_tree() {
	local c kids
	kids=$(children "$1")
	kill -STOP "$1" 2>/dev/null || true
	for c in $kids; do kill_tree "$c"; done
	kill -TERM "$1" 2>/dev/null || true
	kill -CONT "$1" 2>/dev/null || true
}

# run_logged NAME WHAT SECONDS CMD... runs CMD with its output in NAME's log,
# a line when it starts (WHAT, and SECONDS: how long it takes cold), one a
# minute while it runs, and, when it fails, the end of its log and its name.
run_logged() {
	local name=$1 what=$2 est=$3 start=$SECONDS rc=0 logf="$LOGS/$1.log" pid
	shift 3
	log "building $what (about $(minutes "$est") cold)"
	# In the background, so that errexit holds inside the build (a function
	# called where its status is tested runs without it) and this shell
	# can tell the time while it runs.
	"$@" >"$logf" 2>&1 &
	pid=$!
	local next=$((SECONDS + 60))
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		if [[ -n "$STATE" && -e "$STATE/failed" ]]; then
			kill_tree "$pid"
			wait "$pid" 2>/dev/null || true
			die "stopped building $name: a build of the other lane failed (above)"
		fi
		if ((SECONDS >= next)); then
			log "  still building $name: $((SECONDS - start)) s so far (log: $logf)"
			next=$((SECONDS + 60))
		fi
	done
	wait "$pid" || rc=$?
	if ((rc != 0)); then
		log "building $name failed after $((SECONDS - start)) s; the end of its log:"
		tail -n 40 "$logf" | sed 's/^/    /' >&2
		die "building $name failed: its whole log is $logf"
	fi
	[[ -z "${GUESTBACKUP_TIMINGS:-}" ]] || echo "tools/$name $((SECONDS - start))" >>"$GUESTBACKUP_TIMINGS"
}

# run_step TOOL builds TOOL, then says what remains.
run_step() {
	local t=$1 start=$SECONDS
	run_logged "$t" "$(describe "$t")" "$(estimate "$t")" "build_$t"
	rm -f "$STATE/pending/$t"
	local left=() s=0 f
	for f in "$STATE"/pending/*; do
		[[ -e $f ]] || continue
		left+=("$(basename "$f")")
		s=$((s + $(estimate "$(basename "$f")")))
	done
	if ((${#left[@]})); then
		log "built $t in $((SECONDS - start)) s; still to build: ${left[*]} (up to $(minutes "$s") of work, two lanes at once)"
	else
		log "built $t in $((SECONDS - start)) s"
	fi
}

# on_exit, when install_tools ends with an error or a signal, tells the
# other lane and stops every process this script started.
on_exit() {
	local rc=$? c
	((rc == 0)) && return
	touch "$STATE/failed"
	for c in $(children $$); do kill_tree "$c"; done
}

# install_tools TOOL|SET... builds what is missing of the tools named.
install_tools() {
	local t todo=() wanted
	wanted=$(expand_tools "${@:-all}") || exit 1
	wanted=${wanted//$'\n'/ }
	for t in $wanted; do
		built "$t" || todo+=("$t")
	done
	if ((${#todo[@]} == 0)); then
		log "ready in $CACHE: $wanted"
		return
	fi
	check_prerequisites "${todo[@]}"
	local start=$SECONDS total=0
	LOGS="$CACHE/logs/$(date -u +%Y%m%dT%H%M%SZ)-$$"
	STATE="$LOGS/state"
	mkdir -p "$STATE/pending"
	# However this ends before its last step, nothing it started goes on:
	# the other lane sees "failed" and stops, and every build is killed.
	trap 'on_exit' EXIT
	trap 'exit 130' INT TERM
	for t in "${todo[@]}"; do
		total=$((total + $(estimate "$t")))
		touch "$STATE/pending/$t"
	done
	log "to build: ${todo[*]}"
	for t in "${todo[@]}"; do log "  $t: $(describe "$t"), about $(minutes "$(estimate "$t")")"; done
	log "about $(minutes "$total") of work on 2 cores with empty caches, less as the Go builds and the downloads overlap; each step's log is in $LOGS"
	if [[ " ${todo[*]} " == *" guest"* ]]; then
		# KVM is not used even where /dev/kvm exists: nested
		# virtualisation fails on the machines this was built on.
		log "guests run under software emulation (qemu's TCG, never KVM): a boot to cloud-init takes 40-75 s on 2 cores"
	fi
	# Debian packages first, all in one transaction: the io lane's steps
	# and some Go builds (etcd, cgo) need them, and apt takes one lock.
	local pkgs=()
	for t in "${todo[@]}"; do
		for p in $(debs "$t"); do deb_installed "$p" || pkgs+=("$p"); done
	done
	if ((${#pkgs[@]})); then
		local astart=$SECONDS
		log "installing Debian packages: $(printf '%s\n' "${pkgs[@]}" | sort -u | tr '\n' ' ')"
		# shellcheck disable=SC2046 # package names are words
		apt_install $(printf '%s\n' "${pkgs[@]}" | sort -u) >"$LOGS/apt.log" 2>&1 ||
			{ tail -n 40 "$LOGS/apt.log" >&2; die "apt-get install failed: its whole log is $LOGS/apt.log"; }
		log "installed Debian packages in $((SECONDS - astart)) s"
		[[ -n "${GUESTBACKUP_TIMINGS:-}" ]] && echo "tools/debian-packages $((SECONDS - astart))" >>"$GUESTBACKUP_TIMINGS"
	fi
	# The io lane runs in the background while the Go builds keep the
	# cores busy. The test guest carries kopia: it waits for the go lane's
	# kopia, which is built first.
	local io=() go=() iopid=""
	for t in "${todo[@]}"; do
		[[ $t == cluster ]] && continue
		if [[ $(lane "$t") == io ]]; then io+=("$t"); else go+=("$t"); fi
	done
	if ((${#io[@]})); then
		(
			trap '(($? == 0)) || touch "$STATE/failed"' EXIT
			for t in "${io[@]}"; do
				if [[ $t == guest ]]; then
					while [[ ! -x "$KOPIA" ]]; do
						[[ -e "$STATE/failed" ]] && exit 1
						sleep 2
					done
				fi
				run_step "$t"
			done
		) &
		iopid=$!
	fi
	for t in "${go[@]}"; do
		run_step "$t"
	done
	if [[ -n "$iopid" ]]; then
		wait "$iopid" || die "a build of the io lane failed (see above)"
	fi
	[[ " ${todo[*]} " == *" cluster "* ]] && run_step cluster
	log "ready in $CACHE after $((SECONDS - start)) s: $wanted"
}

# plan_tools TOOL|SET... prints what install would build.
plan_tools() {
	local t total=0 todo=() names
	names=$(expand_tools "${@:-all}") || exit 1
	for t in $names; do
		built "$t" && continue
		todo+=("$t")
		total=$((total + $(estimate "$t")))
	done
	if ((${#todo[@]} == 0)); then
		echo "nothing to build: every tool named is ready in $CACHE"
		return
	fi
	for t in "${todo[@]}"; do printf '%-15s %6s  %s\n' "$t" "$(minutes "$(estimate "$t")")" "$(describe "$t")"; done
	echo "about $(minutes "$total") of work on 2 cores when nothing is cached"
}

list_tools() {
	local t state
	for t in "${ALL_TOOLS[@]}" cluster; do
		state=missing
		built "$t" && state=built
		printf '%-15s %-8s %s\n' "$t" "$state" "$(describe "$t")"
	done
	echo "sets: all = ${ALL_TOOLS[*]}"
	echo "      demo = $(expand_tools demo | tr '\n' ' ')"
	echo "      demo-node = $(expand_tools demo-node | tr '\n' ' ')"
	echo "      demo-cluster = $(expand_tools demo-cluster | tr '\n' ' ')"
}

# tool_vars TOOL prints the variables of the tests' environment that point
# at TOOL.
tool_vars() {
	case $1 in
	apiserver) echo KUBEBUILDER_ASSETS ;;
	kopia) echo GUESTBACKUP_KOPIA ;;
	kopia-arm64) echo GUESTBACKUP_KOPIA_ARM64 ;;
	linters) echo GUESTBACKUP_SHELLCHECK GUESTBACKUP_CHECKBASHISMS ;;
	controller-gen) echo GUESTBACKUP_CONTROLLER_GEN ;;
	helm) echo GUESTBACKUP_HELM ;;
	kubectl) echo GUESTBACKUP_KUBECTL ;;
	minio) echo GUESTBACKUP_MINIO ;;
	fake-gcs) echo GUESTBACKUP_FAKE_GCS ;;
	azurite) echo GUESTBACKUP_AZURITE ;;
	cloud-init) echo GUESTBACKUP_CLOUD_INIT_SCHEMA ;;
	guest) echo GUESTBACKUP_GUEST_IMAGE ;;
	guest-stock) echo GUESTBACKUP_GUEST_IMAGE_STOCK ;;
	kubevirt) echo GUESTBACKUP_VIRT_API GUESTBACKUP_VIRT_CONTROLLER ;;
	node) echo GUESTBACKUP_KUBELET GUESTBACKUP_KUBE_SCHEDULER GUESTBACKUP_KUBE_CONTROLLER_MANAGER GUESTBACKUP_PAUSE_IMAGE ;;
	cluster) echo GUESTBACKUP_KUBEVIRT_IMAGES ;;
	esac
}

# NOT_LISTED begins the path a tool's variable gets in an environment that
# does not grant it (env TOOL...): a test that uses it fails on a path that
# names the fix. internal/testbed knows this prefix.
NOT_LISTED=/nonexistent/not-in-hack-test-tools.txt

# print_env [TOOL|SET...] prints the environment the tests read: every tool,
# or, given names, those tools and a NOT_LISTED path for each other one.
print_env() {
	local ci="" t v
	[[ -s "$CLOUD_INIT_STAMP" ]] && ci="$(cat "$CLOUD_INIT_STAMP")/cloud-init-schema"
	local -A value=(
		[KUBEBUILDER_ASSETS]=$ASSETS
		[GUESTBACKUP_KOPIA]=$KOPIA
		[GUESTBACKUP_KOPIA_ARM64]=$KOPIA_ARM64
		[GUESTBACKUP_SHELLCHECK]=$(command -v shellcheck || echo /usr/bin/shellcheck)
		[GUESTBACKUP_CHECKBASHISMS]=$CHECKBASHISMS
		[GUESTBACKUP_CONTROLLER_GEN]=$CONTROLLER_GEN
		[GUESTBACKUP_HELM]=$HELM
		[GUESTBACKUP_KUBECTL]=$KUBECTL
		[GUESTBACKUP_MINIO]=$MINIO
		[GUESTBACKUP_FAKE_GCS]=$FAKE_GCS
		[GUESTBACKUP_AZURITE]=$AZURITE
		[GUESTBACKUP_CLOUD_INIT_SCHEMA]=$ci
		[GUESTBACKUP_GUEST_IMAGE]=$GUEST_IMAGE
		[GUESTBACKUP_GUEST_IMAGE_STOCK]=$GUEST_IMAGE_STOCK
		[GUESTBACKUP_VIRT_API]=$VIRT_API
		[GUESTBACKUP_VIRT_CONTROLLER]=$VIRT_CONTROLLER
		[GUESTBACKUP_KUBELET]=$KUBELET
		[GUESTBACKUP_KUBE_SCHEDULER]=$KUBE_SCHEDULER
		[GUESTBACKUP_KUBE_CONTROLLER_MANAGER]=$KUBE_CONTROLLER_MANAGER
		[GUESTBACKUP_PAUSE_IMAGE]=$PAUSE_IMAGE
		[GUESTBACKUP_KUBEVIRT_IMAGES]=$KUBEVIRT_IMAGES
	)
	if (($#)); then
		local -A granted=()
		local names
		names=$(expand_tools "$@") || exit 1
		for t in $names; do granted[$t]=1; done
		for t in "${ALL_TOOLS[@]}" cluster; do
			[[ -n "${granted[$t]:-}" ]] && continue
			for v in $(tool_vars "$t"); do value[$v]="$NOT_LISTED/$t"; done
		done
	fi
	for v in $(printf '%s\n' "${!value[@]}" | sort); do
		echo "export $v=${value[$v]}"
	done
}

case "${1:-install}" in
install)
	shift || true
	install_tools "$@"
	;;
install-cluster) install_tools cluster ;;
plan)
	shift
	plan_tools "$@"
	;;
list) list_tools ;;
step)
	# A long build of the caller's (the demo's binary), with this script's
	# progress lines and log.
	(($# >= 4)) || die "usage: $0 step NAME SECONDS CMD..."
	LOGS="$CACHE/logs/$(date -u +%Y%m%dT%H%M%SZ)-$$"
	mkdir -p "$LOGS"
	start=$SECONDS
	run_logged "$2" "$2" "$3" "${@:4}"
	log "built $2 in $((SECONDS - start)) s"
	;;
expand)
	shift
	expand_tools "$@"
	;;
env)
	shift
	print_env "$@"
	;;
*) die "usage: $0 [install [TOOL|SET...]|install-cluster|plan [TOOL|SET...]|list|expand TOOL|SET...|env [TOOL|SET...]]" ;;
esac
