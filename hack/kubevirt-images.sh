#!/usr/bin/env bash
# Builds what the cluster backend installs on the test bed's real node, the
# way a KubeVirt release ships it, without a container engine or a registry:
#
#   hack/kubevirt-images.sh dir     print the cache folder of the recipe (no build)
#   hack/kubevirt-images.sh build   build it unless that folder is complete
#
# The folder holds OCI image tarballs for `ctr images import` and the
# manifest a user applies to install KubeVirt:
#   virt-operator.tar virt-api.tar virt-controller.tar   static Go binaries
#   virt-handler.tar virt-launcher.tar                   on one Debian 12 root
#   guest.tar          the test guest: containerDisk and kernelBoot container
#   kubevirt-operator.yaml                               the operator's install
#
# KubeVirt's own images are CentOS Stream roots assembled by Bazel. Ours are a
# Debian 12 root from debootstrap with the packages virt-launcher and
# virt-handler run (libvirt 9.0's daemon and QEMU driver, QEMU 7.2, xorriso,
# nftables), plus what KubeVirt's BUILD files add on top, each for the reason
# given where it is added. The binaries come from hack/tools/kubevirt-cluster,
# which pins the release.
#
# The folder is keyed by a hash of the recipe: this script, hack/image, the
# pinned module and the guest image it packs, so every clone on a machine
# shares one build. Reads:
#   GUESTBACKUP_CACHE_DIR      the cache root (hack/tools.sh passes its own)
#   GUESTBACKUP_GUEST_IMAGE    the test guest's folder (hack/guest-image.sh)
# Needs root, debootstrap, setcap (libcap2-bin), gcc with a static libc,
# libvirt-dev and pkg-config (virt-launcher links libvirt), qemu-img, and the
# archive at $GUESTBACKUP_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/hack/kubevirt-images.sh"
MODULE="$ROOT/hack/tools/kubevirt-cluster"
CACHE="${GUESTBACKUP_CACHE_DIR:-${GUESTBACKUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/guestbackup}}"
MIRROR="${GUESTBACKUP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
VERSION="$(awk '$1 == "kubevirt.io/kubevirt" && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == "kubevirt.io/kubevirt" { print $3; exit }' "$MODULE/go.mod")"
# Where the images are named from; virt-operator derives the others' names
# from its own, as with quay.io/kubevirt on a cluster.
REGISTRY=guestbackup.local/kubevirt
# The node side's packages: libvirt's daemon with the QEMU driver and its
# client (virsh, for the node labeller), QEMU with its firmware and option
# ROMs, qemu-img, xorriso (cloud-init's NoCloud disk), and what virt-handler
# and virt-launcher run for networking and mounts.
PACKAGES=libvirt-daemon,libvirt-daemon-driver-qemu,libvirt-clients,qemu-system-x86,qemu-system-data,seabios,ipxe-qemu,qemu-utils,xorriso,iproute2,nftables,iptables,procps,acl,ca-certificates
SRC=""

log() { printf 'kubevirt-images: %s\n' "$*" >&2; }
die() { printf 'kubevirt-images: error: %s\n' "$*" >&2; exit 1; }

[[ -n "$VERSION" ]] || die "cannot read kubevirt.io/kubevirt's version from $MODULE/go.mod"

images_dir() {
	[[ -n "${GUESTBACKUP_GUEST_IMAGE:-}" ]] || die "GUESTBACKUP_GUEST_IMAGE is not set (run through hack/tools.sh)"
	local key
	key=$( {
		cat "$SELF" "$ROOT/hack/image/main.go" "$ROOT/hack/image/go.sum" "$MODULE/go.sum" "$MODULE"/*/*.go
		echo "guest $(basename "$GUESTBACKUP_GUEST_IMAGE")"
	} | sha256sum | cut -c1-16)
	echo "$CACHE/kubevirt-images/$VERSION-$key"
}

complete() {
	local f
	for f in virt-operator virt-api virt-controller virt-handler virt-launcher guest; do
		[[ -s "$1/$f.tar" ]] || return 1
	done
	[[ -s "$1/kubevirt-operator.yaml" ]]
}

step() {
	local name=$1 start=$SECONDS
	shift
	"$@"
	log "$name: $((SECONDS - start))s"
}

# gobuild CGO OUT CMD builds KubeVirt's command CMD from the pinned module.
gobuild() {
	(cd "$MODULE" && GOSUMDB=off CGO_ENABLED=$1 GOFLAGS=-mod=readonly go build -trimpath -ldflags="-s -w" -o "$2" "kubevirt.io/kubevirt/cmd/$3")
}

build_binaries() {
	local bin=$1 c
	mkdir -p "$bin"
	for c in virt-operator virt-api virt-controller virt-chroot virt-launcher-monitor virt-probe virt-tail virt-freezer; do
		gobuild 0 "$bin/$c" "$c"
	done
	# The node labeller's CPU-model code and virt-launcher's libvirt
	# bindings are cgo.
	gobuild 1 "$bin/virt-handler" virt-handler
	gobuild 1 "$bin/virt-launcher" virt-launcher
	# KubeVirt's containerDisk helper is C; static, as it runs in the guest
	# image's container, which has no libc.
	gcc -static -O2 -o "$bin/container-disk" "$SRC/cmd/container-disk-v2alpha/main.c"
}

# configure_root ROOT adds to the Debian root what KubeVirt's images carry.
configure_root() {
	local r=$1
	# Users: KubeVirt runs QEMU and virt-launcher as qemu (107). Debian's
	# libvirt resolves its built-in user and group, libvirt-qemu, before it
	# reads KubeVirt's qemu.conf, and its QEMU driver fails without them.
	echo 'qemu:x:107:' >>"$r/etc/group"
	echo 'libvirt-qemu:x:64055:' >>"$r/etc/group"
	echo 'qemu:x:107:107:qemu:/home/qemu:/bin/bash' >>"$r/etc/passwd"
	echo 'libvirt-qemu:x:64055:107:libvirt qemu:/var/lib/libvirt:/usr/sbin/nologin' >>"$r/etc/passwd"
	# KubeVirt's libvirt configuration and hook, and its name service order.
	install -m 0644 "$SRC/cmd/virt-launcher/qemu.conf" "$SRC/cmd/virt-launcher/virtqemud.conf" "$r/etc/libvirt/"
	install -D -m 0755 "$SRC/cmd/virt-launcher/qemu" "$r/etc/libvirt/hooks/qemu"
	install -m 0644 "$SRC/cmd/virt-launcher/nsswitch.conf" "$r/etc/nsswitch.conf"
	# virt-launcher starts virtqemud, the modular daemon of CentOS's libvirt,
	# and dials its socket, virtqemud-sock (as user 107: in the session
	# folder, $XDG_RUNTIME_DIR/libvirt). Debian 12 ships the monolithic
	# libvirtd, which takes the same configuration file and serves the same
	# API on libvirt-sock in the same folder.
	cat >"$r/usr/sbin/virtqemud" <<'SHIM'
#!/bin/sh
# virtqemud for KubeVirt on Debian: libvirtd, reachable by virtqemud's socket name.
dir=/run/libvirt
[ "$(id -u)" = 0 ] || dir="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/libvirt"
mkdir -p "$dir"
ln -sfn libvirt-sock "$dir/virtqemud-sock"
exec /usr/sbin/libvirtd "$@"
SHIM
	chmod 0755 "$r/usr/sbin/virtqemud"
	# virt-launcher starts virtlogd with -f /etc/libvirt/virtlogd.conf, which
	# Debian ships only in libvirt-daemon-system: libvirt's defaults.
	echo '# libvirt defaults (virt-launcher passes this file to virtlogd)' >"$r/etc/libvirt/virtlogd.conf"
	mkdir -p "$r/var/log/libvirt/qemu" "$r/usr/lib64/qemu-kvm" "$r/home/qemu"
	chown 107:107 "$r/home/qemu"
	# virt-handler reaches a launcher's sockets through /proc/PID/root, where
	# an absolute link resolves in virt-handler's root, not the launcher's:
	# KubeVirt's base links these relatively, Debian's absolutely.
	rm -rf "$r/var/run" "$r/var/lock"
	ln -s ../run "$r/var/run"
	ln -s ../run/lock "$r/var/lock"
	# KubeVirt's QEMU binds privileged ports for VNC and migration as user
	# 107: its image gives QEMU the capability in the file (rpm/BUILD.bazel).
	setcap cap_net_bind_service+ep "$r/usr/bin/qemu-system-x86_64"
	rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/var/log/*.log "$r"/tmp/*
	: >"$r/etc/machine-id"
	# debootstrap copied this machine's name and resolvers into the root: an
	# image carries neither (the kubelet gives each container its own).
	rm -f "$r/etc/hostname"
	: >"$r/etc/resolv.conf"
}

# tarlayer DIR OUT writes DIR as a layer, keeping ownership and the file
# capabilities (security.capability), which containerd applies on import.
tarlayer() {
	tar --numeric-owner --xattrs --xattrs-include=security.capability -C "$1" -cf "$2" .
}

# image OUT TAG ENTRYPOINT USER ARGS... writes one image with hack/image.
image() {
	local out=$1 tag=$2 entrypoint=$3 user=$4
	shift 4
	(cd "$ROOT/hack/image" && GOFLAGS=-mod=readonly go run . -out "$out" -tag "$tag" -entrypoint "$entrypoint" -user "$user" \
		-env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@")
}

build() {
	local dir tmp start=$SECONDS
	dir=$(images_dir)
	if complete "$dir"; then
		log "KubeVirt $VERSION images ready in $dir"
		return
	fi
	[[ $(id -u) -eq 0 ]] || die "building KubeVirt's images needs root (debootstrap, setcap, file ownership)"
	local tool
	for tool in debootstrap setcap gcc pkg-config qemu-img tar flock go; do
		command -v "$tool" >/dev/null || die "$tool is not installed (run make tools)"
	done
	[[ -s "$GUESTBACKUP_GUEST_IMAGE/root.img" ]] || die "the guest image $GUESTBACKUP_GUEST_IMAGE is not built (run make tools)"
	mkdir -p "$(dirname "$dir")"
	exec 9>"$(dirname "$dir")/.lock"
	flock 9
	if complete "$dir"; then
		log "KubeVirt $VERSION images ready in $dir"
		return
	fi
	find "$(dirname "$dir")" -mindepth 1 -maxdepth 1 -type d -name '*.tmp.*' -exec rm -rf --one-file-system {} +
	# go list names the module's folder only once it is downloaded, and a
	# fresh module cache (a CI machine's) has never built KubeVirt.
	(cd "$MODULE" && GOSUMDB=off GOFLAGS=-mod=readonly go mod download kubevirt.io/kubevirt) ||
		die "cannot download kubevirt.io/kubevirt $VERSION (is the Go module proxy reachable?)"
	SRC=$(cd "$MODULE" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
	[[ -d "$SRC/cmd" ]] || die "kubevirt.io/kubevirt $VERSION is not in the module cache ($SRC)"
	log "building KubeVirt $VERSION's images in $dir (7-9 minutes on 2 cores after make tools, about 2 when Go's build cache has KubeVirt; needs $MIRROR)"
	tmp=$(mktemp -d "$dir.tmp.XXXXXX")
	chmod 0755 "$tmp"
	trap 'for m in proc sys dev/pts dev; do umount -l "'"$tmp"'/root/$m" 2>/dev/null || true; done; rm -rf --one-file-system "'"$tmp"'"' EXIT

	step "KubeVirt's binaries" build_binaries "$tmp/bin"
	local out
	if ! out=$(step "debootstrap $SUITE" debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp/root" "$MIRROR" 2>&1); then
		printf '%s\n' "$out" | tail -n 30 >&2
		die "debootstrap $SUITE from $MIRROR failed (is the archive reachable?)"
	fi
	printf '%s\n' "$out" | grep -E '^kubevirt-images:' >&2 || true
	step "configure the root" configure_root "$tmp/root"
	step "root layer" tarlayer "$tmp/root" "$tmp/root.tar"

	# The launcher's binaries, as KubeVirt's virt-launcher-tar: the monitor
	# keeps NET_BIND_SERVICE across exec as user 107 only from its file
	# (cmd/virt-launcher/BUILD.bazel's setcaps).
	local b="$tmp/bin"
	mkdir -p "$tmp/launcher/usr/bin" "$tmp/handler/usr/bin"
	install -m 0755 "$b/virt-launcher" "$b/virt-launcher-monitor" "$b/virt-probe" "$b/virt-tail" "$b/virt-freezer" \
		"$b/container-disk" "$SRC/cmd/virt-launcher/node-labeller/node-labeller.sh" "$tmp/launcher/usr/bin/"
	setcap cap_net_bind_service+ep "$tmp/launcher/usr/bin/virt-launcher-monitor"
	install -m 0755 "$b/virt-handler" "$b/virt-chroot" "$tmp/handler/usr/bin/"
	tarlayer "$tmp/launcher" "$tmp/launcher.tar"
	tarlayer "$tmp/handler" "$tmp/handler.tar"
	step "virt-launcher image" image "$tmp/virt-launcher.tar" "$REGISTRY/virt-launcher:$VERSION" /usr/bin/virt-launcher 0:0 \
		-layer "$tmp/root.tar" -layer "$tmp/launcher.tar"
	step "virt-handler image" image "$tmp/virt-handler.tar" "$REGISTRY/virt-handler:$VERSION" /usr/bin/virt-handler 0:0 \
		-layer "$tmp/root.tar" -layer "$tmp/handler.tar"
	# The control plane is static and runs as KubeVirt's non-root user.
	local c
	for c in virt-operator virt-api virt-controller; do
		step "$c image" image "$tmp/$c.tar" "$REGISTRY/$c:$VERSION" "/usr/bin/$c" 1001:1001 -file "/usr/bin/$c=$b/$c"
	done

	# The test guest as a containerDisk (the disk under /disk, owned by
	# QEMU's user, as KubeVirt documents) and, in the same image, the kernel
	# and initrd a kernelBoot container serves: the guest's root file system
	# has no boot loader.
	mkdir -p "$tmp/guest/disk" "$tmp/guest/boot"
	step "guest disk (qcow2)" qemu-img convert -O qcow2 "$GUESTBACKUP_GUEST_IMAGE/root.img" "$tmp/guest/disk/disk.qcow2"
	install -m 0444 "$GUESTBACKUP_GUEST_IMAGE/vmlinuz" "$tmp/guest/boot/vmlinuz"
	install -m 0444 "$GUESTBACKUP_GUEST_IMAGE/initrd.img" "$tmp/guest/boot/initrd.img"
	chmod 0440 "$tmp/guest/disk/disk.qcow2"
	chown -R 107:107 "$tmp/guest"
	tarlayer "$tmp/guest" "$tmp/guest-layer.tar"
	step "guest image" image "$tmp/guest.tar" "guestbackup.local/guest:$(basename "$GUESTBACKUP_GUEST_IMAGE")" /usr/bin/container-disk 107:107 \
		-layer "$tmp/guest-layer.tar"

	(cd "$MODULE" && GOSUMDB=off GOFLAGS=-mod=readonly go run ./kubevirt-operator-manifests -registry "$REGISTRY" -tag "$VERSION") >"$tmp/kubevirt-operator.yaml"
	{
		echo "kubevirt=$VERSION"
		echo "registry=$REGISTRY"
		echo "suite=$SUITE"
		echo "packages=$PACKAGES"
		echo "guest=guestbackup.local/guest:$(basename "$GUESTBACKUP_GUEST_IMAGE")"
		echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	} >"$tmp/recipe.txt"
	rm -rf --one-file-system "$tmp/root" "$tmp/bin" "$tmp/launcher" "$tmp/handler" "$tmp/guest" "$tmp"/*-layer.tar "$tmp/root.tar" "$tmp/launcher.tar" "$tmp/handler.tar"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	trap - EXIT
	log "built KubeVirt $VERSION's images in $((SECONDS - start))s: $(du -sh "$dir" | cut -f1)"
}

case "${1:-}" in
dir) images_dir ;;
build) build ;;
*) die "usage: $0 dir|build" ;;
esac
