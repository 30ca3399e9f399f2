#!/bin/sh
# install.sh: puts guestbackup's bootstrap from this disk in place and
# starts it. Run by the guest's guestbackup-disk unit at every boot; safe
# to run again. DESTDIR installs under another root and starts nothing.
set -eu
src=$(dirname "$0")
dest=${DESTDIR:-}
root=$dest
install -D -m 600 "$src"/'guestbackup.conf' "$dest"'/etc/guestbackup/guestbackup.conf'
install -D -m 600 "$src"/'password' "$dest"'/etc/guestbackup/password'
install -D -m 644 "$src"/'ca.crt' "$dest"'/etc/guestbackup/trust/ca.crt'
install -D -m 755 "$src"/'guestbackup-kopia' "$dest"'/usr/local/bin/guestbackup-kopia'
install -D -m 755 "$src"/'guestbackup-connect' "$dest"'/usr/local/sbin/guestbackup-connect'
install -D -m 644 "$src"/'guestbackup-connect.service' "$dest"'/etc/systemd/system/guestbackup-connect.service'
install -D -m 600 "$src"/'paths' "$dest"'/etc/guestbackup/paths'
install -D -m 755 "$src"/'guestbackup-snapshot' "$dest"'/usr/local/sbin/guestbackup-snapshot'
install -D -m 644 "$src"/'guestbackup-snapshot.service' "$dest"'/etc/systemd/system/guestbackup-snapshot.service'
install -D -m 644 "$src"/'guestbackup-snapshot.timer' "$dest"'/etc/systemd/system/guestbackup-snapshot.timer'
mkdir -p "$root"/run/guestbackup && echo 1 >"$root"/run/guestbackup/bootstrap
[ -n "$root" ] || ! [ -d /run/systemd/system ] || systemctl disable --now guestbackup-requests.service >/dev/null 2>&1 || true
rm -f "$root"/usr/local/sbin/guestbackup-requests "$root"/etc/systemd/system/guestbackup-requests.service
if [ -z "$root" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable guestbackup-connect.service guestbackup-snapshot.timer
  systemctl restart --no-block guestbackup-connect.service guestbackup-snapshot.timer
fi
