// Package guest proves the zero-touch path in a real Linux guest: the test
// bed's Debian image boots under qemu with guestbackup's cloud-init bootstrap
// merged into the guest's own user-data (or, in disk mode, on a disk), and
// its kopia connects to a real Kopia server on the host's loopback and
// snapshots its paths with nothing but the injected data.
package guest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
)

const (
	backedUp   = "/etc/guestbackup-test"
	helloText  = "hello from the guest\n"
	diskLabel  = "testdisk"
	diskSerial = "testdisk-serial"
	diskText   = "from the extra disk\n"
	// waitSeconds bounds the guest's own wait for its first snapshot.
	waitSeconds = 300
)

// userConfig is the VM owner's own cloud-config: a file to back up, and a
// waiter that reports on the console when the first snapshot exists, then
// powers the guest off. The waiter runs as its own unit: runcmd is one
// script, and the owner's part runs before guestbackup's, which starts
// the connect service.
var userConfig = `#cloud-config
write_files:
- path: ` + backedUp + `/hello.txt
  content: "hello from the guest\n"
- path: /usr/local/sbin/guestbackup-test-wait
  permissions: '0755'
  content: |
    #!/bin/sh
    # Reports the bootstrap's progress on the console, then powers off.
    export HOME=/root KOPIA_CHECK_FOR_UPDATES=false
    up() { cut -d' ' -f1 /proc/uptime; }
    say() { echo "GUESTBACKUP-TEST $*" >/dev/console; }
    say "waiting uptime=$(up)"
    dev=/dev/disk/by-id/virtio-` + diskSerial + `
    mnt=$(mktemp -d)
    if [ -e /dev/disk/by-label/` + diskLabel + ` ] && mount -o ro "$dev" "$mnt"; then
      say "disk $(cat "$mnt/note.txt")"
      umount "$mnt"
    else
      say "disk missing: $(ls /dev/disk/by-id /dev/disk/by-label | tr '\n' ' ')"
    fi
    connected=
    i=0
    while [ "$i" -lt ` + strconv.Itoa(waitSeconds) + ` ]; do
      if [ -z "$connected" ] && grep -q ' connected to ' /var/lib/guestbackup/status 2>/dev/null; then
        connected=1
        say "connected uptime=$(up)"
      fi
      if [ -n "$connected" ] && [ -e /var/lib/guestbackup/last-snapshot-attempt ]; then
        if kopia snapshot list --json ` + backedUp + ` | grep -q '"id"'; then
          say "snapshot uptime=$(up)"
        else
          say "snapshot failed"
        fi
        break
      fi
      sleep 2
      i=$((i + 2))
    done
    [ "$i" -lt ` + strconv.Itoa(waitSeconds) + ` ] || say "timeout"
    say "status $(cat /var/lib/guestbackup/status 2>/dev/null)"
    journalctl --no-pager -o short-monotonic -u guestbackup-connect -u guestbackup-snapshot | tail -n 20 | sed 's/^/GUESTBACKUP-TEST journal /' >/dev/console
    systemctl poweroff
runcmd:
- [systemd-run, --unit=guestbackup-test-wait, --no-block, /usr/local/sbin/guestbackup-test-wait]
`

var markerPattern = regexp.MustCompile(`(?m)^GUESTBACKUP-TEST (\S+)(?: (.*?))?\r?$`)

// markers returns the waiter's console lines by their first word.
func markers(console string) map[string]string {
	m := map[string]string{}
	for _, match := range markerPattern.FindAllStringSubmatch(console, -1) {
		if _, seen := m[match[1]]; !seen {
			m[match[1]] = match[2]
		}
	}
	return m
}

// journal returns the guest services' journal lines the waiter printed.
func journal(console string) string {
	var lines []string
	for _, line := range strings.Split(console, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "GUESTBACKUP-TEST journal "); ok {
			lines = append(lines, rest)
		}
	}
	return strings.Join(lines, "\n")
}

// uptime reads the uptime=<seconds> of a marker.
func uptime(marker string) (float64, bool) {
	_, v, ok := strings.Cut(marker, "uptime=")
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	return f, err == nil
}

// TestGuestConnectsAndSnapshotsWithOnlyTheBootstrap: cloud-init mode, the
// bootstrap merged into the VM's own cloud-config.
func TestGuestConnectsAndSnapshotsWithOnlyTheBootstrap(t *testing.T) {
	zeroTouch(t, "web@team-a", false)
}

// TestDiskModeGuestConnectsFromTheSecretDisk: disk mode, the VM's own
// cloud-config untouched and the bootstrap on a disk (serial and label
// guestbackup) that the image's one-time unit installs.
func TestDiskModeGuestConnectsFromTheSecretDisk(t *testing.T) {
	zeroTouch(t, "db@team-a", true)
}

// zeroTouch boots a guest with the bootstrap for guestUser, in cloud-init or
// disk mode, and proves from the host that its first snapshot holds the
// guest's file.
func zeroTouch(t *testing.T, guestUser string, diskMode bool) {
	ctx := context.Background()
	srv := testbed.StartKopiaServer(t, testbed.KopiaServerOptions{})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatalf("server URL %q: %v", srv.URL, err)
	}
	password := testbed.RandomPassword()
	srv.AddUser(t, guestUser, password)

	// The guest reaches the server on the host's loopback through qemu's
	// user network; it pins the CA, so the certificate's names (127.0.0.1)
	// do not matter.
	b := cloudinit.Bootstrap{
		ServerURL:  "https://" + testbed.GuestHostAddress + ":" + u.Port(),
		Pin:        srv.CAPin,
		Username:   guestUser,
		Password:   password,
		Generation: 1,
		Paths:      []string{backedUp},
	}
	disks := []testbed.GuestDisk{{
		Files:  map[string][]byte{"note.txt": []byte(diskText)},
		Label:  diskLabel,
		Serial: diskSerial,
	}}
	userData := []byte(userConfig)
	if diskMode {
		files, err := cloudinit.DiskFiles(b)
		if err != nil {
			t.Fatalf("render disk-mode bootstrap: %v", err)
		}
		disks = append(disks, testbed.GuestDisk{Files: files, Label: "guestbackup", Serial: "guestbackup"})
	} else {
		ours, err := cloudinit.CloudConfig(b)
		if err != nil {
			t.Fatalf("render bootstrap: %v", err)
		}
		if userData, err = cloudinit.Merge(userData, ours); err != nil {
			t.Fatalf("merge bootstrap into the user's cloud-config: %v", err)
		}
	}

	res := testbed.BootGuest(t, testbed.GuestOptions{UserData: userData, ExtraDisks: disks})
	m := markers(res.Console)
	report := fmt.Sprintf("guest ran %v (boot to power off)", res.Elapsed.Round(time.Second))
	if up, ok := uptime(m["waiting"]); ok {
		report += fmt.Sprintf("; cloud-init ran the user's runcmd at %.0fs of uptime", up)
	}
	if up, ok := uptime(m["connected"]); ok {
		report += fmt.Sprintf("; kopia connected at %.0fs", up)
	}
	if up, ok := uptime(m["snapshot"]); ok {
		report += fmt.Sprintf("; first snapshot at %.0fs", up)
	}
	t.Log(report)
	t.Logf("the guest's connect and snapshot services (uptime in brackets):\n%s", journal(res.Console))
	if got := m["disk"]; got != strings.TrimSpace(diskText) {
		t.Errorf("extra disk (label %s, serial %s) in the guest: got %q, want %q", diskLabel, diskSerial, got, strings.TrimSpace(diskText))
	}
	if _, ok := m["snapshot"]; !ok {
		t.Fatalf("the guest saw no snapshot of %s (status: %q)", backedUp, m["status"])
	}

	// From the host, as the VM's own user: the snapshot is there and holds
	// the guest's file.
	client := testbed.NewKopiaClient(t)
	if out, err := client.Connect(ctx, srv.URL, srv.CAPin, guestUser, password); err != nil {
		t.Fatalf("connect as %s: %v\n%s", guestUser, err, out)
	}
	ids, err := client.SnapshotIDs(ctx, backedUp)
	if err != nil {
		t.Fatalf("list snapshots of %s: %v", backedUp, err)
	}
	if len(ids) == 0 {
		t.Fatalf("no snapshot of %s on the server for %s", backedUp, guestUser)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	if out, err := client.Run(ctx, "snapshot", "restore", ids[0], restored); err != nil {
		t.Fatalf("restore %s: %v\n%s", ids[0], err, out)
	}
	got, err := os.ReadFile(filepath.Join(restored, "hello.txt"))
	if err != nil {
		t.Fatalf("restored snapshot: %v", err)
	}
	if string(got) != helloText {
		t.Fatalf("restored hello.txt = %q, want %q", got, helloText)
	}
}
