#!/usr/bin/env bash
# Builds the test bed's Linux guest: a Debian bookworm root filesystem with
# systemd, cloud-init (NoCloud only), the kopia CLI and guestbackup's
# disk-mode unit, as a raw ext4 image plus the kernel and initrd to boot it
# with qemu (see internal/testbed/guest.go).
#
#   hack/guest-image.sh dir [stock]    print the image's cache folder (no build)
#   hack/guest-image.sh build [stock]  build it unless that folder is complete
#
# The "stock" variant is as close to a stock cloud image as debootstrap
# allows: cloud-init, curl and python3, and nothing of guestbackup's (no
# kopia, no disk-mode unit). Its guests fetch kopia from their server.
#
# The folder is keyed by a hash of the recipe: this script, the guest unit
# files it installs and the kopia version, so every clone on a machine shares
# one image and any change to the recipe builds a new one. Reads:
#   GUESTBACKUP_CACHE_DIR   the cache root (hack/tools.sh passes its own)
#   GUESTBACKUP_KOPIA       the static kopia binary to install
#   GUESTBACKUP_KOPIA_VERSION  its version, part of the key
# Needs root and Debian's debootstrap, e2fsprogs (mkfs.ext4 -d) and the
# archive at $GUESTBACKUP_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/hack/guest-image.sh"
UNIT_FILES=("$ROOT/pkg/cloudinit/guest/guestbackup-disk" "$ROOT/pkg/cloudinit/guest/guestbackup-disk.service")
CACHE="${GUESTBACKUP_CACHE_DIR:-${GUESTBACKUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/guestbackup}}"
MIRROR="${GUESTBACKUP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# python3-cffi-backend: debootstrap does not resolve virtual packages, and
# cloud-init's dependencies need one it provides.
PACKAGES=systemd-sysv,udev,kmod,dbus,iproute2,python3-cffi-backend,cloud-init,linux-image-cloud-amd64,initramfs-tools,ca-certificates
VARIANT=${2:-test}
case "$VARIANT" in
test) ;;
# Stock cloud images (Debian's, Ubuntu's, Fedora's) all carry curl.
stock) PACKAGES="$PACKAGES,curl" ;;
*) printf 'guest-image: error: unknown variant %s (want test or stock)\n' "$VARIANT" >&2; exit 1 ;;
esac
IMAGE_SIZE=2G

log() { printf 'guest-image: %s\n' "$*" >&2; }
die() { printf 'guest-image: error: %s\n' "$*" >&2; exit 1; }

# image_dir prints the cache folder of the current recipe.
image_dir() {
	local key
	[[ -n "${GUESTBACKUP_KOPIA_VERSION:-}" ]] || die "GUESTBACKUP_KOPIA_VERSION is not set (run through hack/tools.sh)"
	key=$( {
		cat "$SELF" "${UNIT_FILES[@]}"
		echo "kopia $GUESTBACKUP_KOPIA_VERSION variant $VARIANT"
	} | sha256sum | cut -c1-16)
	if [[ $VARIANT == stock ]]; then
		echo "$CACHE/guest-image/$SUITE-stock-$key"
	else
		echo "$CACHE/guest-image/$SUITE-$key"
	fi
}

# step NAME CMD... runs CMD and reports how long it took.
step() {
	local name=$1 start=$SECONDS
	shift
	"$@"
	log "$name: $((SECONDS - start))s"
}

# configure ROOTFS resets what debootstrap copied from the host and sets the
# guest up for the test bed.
configure() {
	local r=$1
	echo guest >"$r/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tguest\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
	# qemu user networking's DNS; the guest needs none, but a host's
	# resolv.conf must not leak into the image.
	echo "nameserver 10.0.2.3" >"$r/etc/resolv.conf"
	# Empty: systemd makes a new one at first boot, as on any cloud image.
	: >"$r/etc/machine-id"
	rm -f "$r/var/lib/dbus/machine-id"
	echo "/dev/vda / ext4 defaults 0 1" >"$r/etc/fstab"
	# DHCP on the virtio NIC even before cloud-init renders its own network.
	cat >"$r/etc/systemd/network/80-guest-dhcp.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=yes
EOF
	cat >"$r/etc/cloud/cloud.cfg.d/90-guestbackup-testbed.cfg" <<'EOF'
# guestbackup test bed: seeds come from a NoCloud ISO (label cidata), as
# KubeVirt delivers cloudInitNoCloud.
datasource_list: [NoCloud, None]
locale: C.UTF-8
EOF
	# No ssh server in the image: cloud-init's ssh module would only fail.
	sed -i -E '/^[[:space:]]*-[[:space:]]*ssh[[:space:]]*$/d' "$r/etc/cloud/cloud.cfg"
	grep -qE '^[[:space:]]*-[[:space:]]*ssh[[:space:]]*$' "$r/etc/cloud/cloud.cfg" && die "ssh module still in cloud.cfg"

	chroot "$r" systemctl enable --quiet systemd-networkd.service
	# Nothing may run apt (offline, and slow under emulation).
	chroot "$r" systemctl mask --quiet apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service
	if [[ $VARIANT == stock ]]; then
		[[ ! -e "$r/usr/local/bin/kopia" ]] || die "the stock image has a kopia"
		chroot "$r" curl --version >/dev/null || die "curl does not run in the guest's root"
	else
		install -m 0755 "$GUESTBACKUP_KOPIA" "$r/usr/local/bin/kopia"
		install -m 0755 "${UNIT_FILES[0]}" "$r/usr/local/sbin/guestbackup-disk"
		install -m 0644 "${UNIT_FILES[1]}" "$r/etc/systemd/system/guestbackup-disk.service"
		chroot "$r" systemctl enable --quiet guestbackup-disk.service
		chroot "$r" /usr/local/bin/kopia --version >/dev/null || die "kopia does not run in the guest's root"
	fi

	rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/var/log/*.log "$r"/tmp/*
}

build() {
	local dir tmp start=$SECONDS
	dir=$(image_dir)
	if [[ -s "$dir/root.img" && -s "$dir/vmlinuz" && -s "$dir/initrd.img" ]]; then
		log "guest image ready in $dir"
		return
	fi
	[[ $(id -u) -eq 0 ]] || die "building the guest image needs root (debootstrap, chroot)"
	mkdir -p "$(dirname "$dir")"
	# One build at a time per cache: a second `make tools` waits, then finds
	# the image built.
	exec 9>"$(dirname "$dir")/.lock"
	flock 9
	if [[ -s "$dir/root.img" && -s "$dir/vmlinuz" && -s "$dir/initrd.img" ]]; then
		log "guest image ready in $dir"
		return
	fi
	# Builds interrupted before (the lock is ours, so none runs now).
	find "$(dirname "$dir")" -mindepth 1 -maxdepth 1 -type d -name '*.tmp.*' -exec rm -rf --one-file-system {} +
	[[ $VARIANT == stock || -x "${GUESTBACKUP_KOPIA:-}" ]] || die "GUESTBACKUP_KOPIA ($GUESTBACKUP_KOPIA) is not built"
	for tool in debootstrap mkfs.ext4 chroot flock; do
		command -v "$tool" >/dev/null || die "$tool is not installed"
	done
	log "building the guest image in $dir (about 1.5-5 minutes; needs $MIRROR)"
	tmp=$(mktemp -d "$dir.tmp.XXXXXX")
	chmod 0755 "$tmp"
	# Unmount whatever debootstrap left mounted before removing the tree.
	trap 'for m in proc sys dev/pts dev; do umount -l "'"$tmp"'/rootfs/$m" 2>/dev/null || true; done; rm -rf --one-file-system "'"$tmp"'"' EXIT
	local out
	if ! out=$(step "debootstrap $SUITE" debootstrap --variant=minbase --include="$PACKAGES" \
		"$SUITE" "$tmp/rootfs" "$MIRROR" 2>&1); then
		printf '%s\n' "$out" | tail -n 30 >&2
		[[ -f "$tmp/rootfs/debootstrap/debootstrap.log" ]] && tail -n 30 "$tmp/rootfs/debootstrap/debootstrap.log" >&2
		die "debootstrap $SUITE from $MIRROR failed (is the archive reachable?)"
	fi
	printf '%s\n' "$out" | grep -E '^guest-image:' >&2 || true
	step configure configure "$tmp/rootfs"
	local kernel initrd
	kernel=$(ls "$tmp"/rootfs/boot/vmlinuz-* | sort -V | tail -n 1)
	initrd=$(ls "$tmp"/rootfs/boot/initrd.img-* | sort -V | tail -n 1)
	[[ -s "$kernel" && -s "$initrd" ]] || die "no kernel or initrd in the guest's /boot"
	cp "$kernel" "$tmp/vmlinuz"
	cp "$initrd" "$tmp/initrd.img"
	# -d fills the file system from the tree: no loop mount needed.
	step "mkfs.ext4 $IMAGE_SIZE" mkfs.ext4 -q -F -L guestroot -d "$tmp/rootfs" "$tmp/root.img" "$IMAGE_SIZE" >/dev/null
	rm -rf --one-file-system "$tmp/rootfs"
	{
		echo "suite=$SUITE"
		echo "packages=$PACKAGES"
		echo "kernel=$(basename "$kernel")"
		echo "variant=$VARIANT"
		[[ $VARIANT == stock ]] || echo "kopia=$GUESTBACKUP_KOPIA_VERSION"
		echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	} >"$tmp/recipe.txt"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	trap - EXIT
	log "built the guest image in $((SECONDS - start))s: $(du -sh --apparent-size "$dir/root.img" | cut -f1) image, $(du -sh "$dir" | cut -f1) on disk"
}

case "${1:-}" in
dir) image_dir ;;
build) build ;;
*) die "usage: $0 dir|build" ;;
esac
