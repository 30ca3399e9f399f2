#!/bin/sh
# install.sh: puts guestbackup's bootstrap from this disk in place and
# starts it. Run by the guest's guestbackup-disk unit; safe to run again.
set -eu
src=$(dirname "$0")
install -D -m 600 "$src"/'guestbackup.conf' '/etc/guestbackup/guestbackup.conf'
install -D -m 600 "$src"/'password' '/etc/guestbackup/password'
install -D -m 755 "$src"/'guestbackup-connect' '/usr/local/sbin/guestbackup-connect'
install -D -m 644 "$src"/'guestbackup-connect.service' '/etc/systemd/system/guestbackup-connect.service'
install -D -m 600 "$src"/'paths' '/etc/guestbackup/paths'
install -D -m 755 "$src"/'guestbackup-snapshot' '/usr/local/sbin/guestbackup-snapshot'
install -D -m 644 "$src"/'guestbackup-snapshot.service' '/etc/systemd/system/guestbackup-snapshot.service'
install -D -m 644 "$src"/'guestbackup-snapshot.timer' '/etc/systemd/system/guestbackup-snapshot.timer'
systemctl daemon-reload
systemctl enable guestbackup-connect.service
systemctl restart guestbackup-connect.service
systemctl enable guestbackup-snapshot.timer
systemctl restart guestbackup-snapshot.timer
