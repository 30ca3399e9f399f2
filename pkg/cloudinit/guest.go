package cloudinit

import _ "embed"

// GuestDiskScript is the guest side of disk mode, installed once into an
// image as /usr/local/sbin/guestbackup-disk (see docs/guest.md): it mounts
// the secret disk read-only and runs the install.sh DiskFiles wrote.
//
//go:embed guest/guestbackup-disk
var GuestDiskScript []byte

// GuestDiskUnit is the systemd unit that runs GuestDiskScript whenever the
// secret disk appears, so a rotated password is installed at the next boot.
//
//go:embed guest/guestbackup-disk.service
var GuestDiskUnit []byte
