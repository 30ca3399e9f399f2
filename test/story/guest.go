package story

import (
	"regexp"
	"strings"
)

// ReportPrelude starts the owner's report script: the test bed's stand-in
// for someone logging in. It waits, bounded, for the guest's first
// snapshot attempt, and defines say, which writes a marker line to the
// console.
const ReportPrelude = `#!/bin/sh
    export HOME=/root KOPIA_CHECK_FOR_UPDATES=false
    say() { echo "GB-E2E $*" >/dev/console; }
    snapshot_id() { guestbackup-kopia snapshot list --json "$1" | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -n 1; }
    i=0
    while [ $i -lt 300 ] && ! [ -e /var/lib/guestbackup/last-snapshot-attempt ]; do sleep 2; i=$((i+2)); done
    say "uptime $(cut -d' ' -f1 /proc/uptime)"
    say "status $(cat /var/lib/guestbackup/status 2>/dev/null)"
    journalctl --no-pager -u guestbackup-connect -u guestbackup-disk | tail -n 12 | sed 's/^/GB-E2E-LOG /' >/dev/console
`

// WebConfig is the first VM owner's own inline cloud-config: a file to back
// up, another to back up when asked from the cluster, a marker, the
// owner's snapshot hooks (a pre-hook that refuses the request web-hooked,
// saying why, after writing over /srv/asked/note.txt by mistake and adding
// a file beside it, and a post-hook that notes every request it ran after),
// and a report that waits for the guest's answers to that request, to the
// restore asked after it (GuestRestore web-restore-asked), to web-hooked
// and to the restore of /srv/asked in place after it (web-in-place),
// restores the
// asked-for file from the snapshot it took, and restores the file from the
// guest's first snapshot after deleting it, then changes that file twice,
// snapshotting after each change (three versions in all), and powers the
// guest off.
const WebConfig = `#cloud-config
write_files:
- path: /srv/data/hello.txt
  content: "hello from the guest\n"
- path: /srv/asked/note.txt
  content: "asked for from the cluster\n"
- path: /var/tmp/owner-marker
  content: "the owner's own cloud-config ran\n"
- path: /srv/hooked/db.txt
  content: "rows the pre-hook must quiesce first\n"
- path: /etc/guestbackup/hooks/pre-snapshot.d/10-quiesce
  permissions: '0755'
  content: |
    #!/bin/sh
    [ "$GUESTBACKUP_REQUEST" = web-hooked ] || exit 0
    echo "quiescing $GUESTBACKUP_PATHS"
    # The owner's slip, which the restore in place after it mends.
    echo "written over by mistake" >/srv/asked/note.txt
    echo "kept beside the restore" >/srv/asked/later.txt
    echo "the database is not ready: try again later" >&2
    exit 1
- path: /etc/guestbackup/hooks/post-snapshot.d/10-resume
  permissions: '0755'
  content: |
    #!/bin/sh
    echo "${GUESTBACKUP_REQUEST:-scheduled}" >>/var/tmp/post-hooks
- path: /usr/local/sbin/report
  permissions: '0755'
  content: |
    ` + ReportPrelude + `    say "marker $(cat /var/tmp/owner-marker)"
    answered() { journalctl --no-pager -u guestbackup-requests | sed -n 's/.*guestbackup: answered request \([^:]*\): \(.*\)/\1 \2/p'; }
    i=0
    while [ $i -lt 300 ] && [ "$(answered | wc -l)" -lt 4 ]; do sleep 2; i=$((i+2)); done
    say "requested $(answered | sed -n 1p)"
    say "hooked $(answered | sed -n 3p)"
    say "in-place $(answered | sed -n 4p) $(sha256sum </srv/asked/note.txt | cut -d' ' -f1) $(cat /srv/asked/later.txt)"
    say "post-hooks $(grep -c '^web-hooked$' /var/tmp/post-hooks 2>/dev/null)"
    journalctl --no-pager -u guestbackup-requests | tail -n 12 | sed 's/^/GB-E2E-LOG /' >/dev/console
    restored=/var/lib/guestbackup/restores/web-restore-asked/srv/asked/note.txt
    say "cluster-restore $(answered | sed -n 2p) $(sha256sum <$restored | cut -d' ' -f1) $(stat -c %a:%U:%G $restored) $(stat -c %a:%U:%G /srv/asked/note.txt)"
    asked=$(snapshot_id /srv/asked)
    if guestbackup-kopia restore "$asked/note.txt" /var/tmp/asked.txt >/var/tmp/asked.log 2>&1 && cmp -s /srv/asked/note.txt /var/tmp/asked.txt; then
      say "asked-restore $asked identical $(sha256sum </var/tmp/asked.txt | cut -d' ' -f1)"
    else
      say "asked-restore $asked failed $(tail -n 3 /var/tmp/asked.log | tr '\n' ' ')"
    fi
    say "snapshots $(guestbackup-kopia snapshot list --json /srv/data | grep -c '"id"')"
    id=$(snapshot_id /srv/data)
    cp /srv/data/hello.txt /var/tmp/hello.orig
    rm /srv/data/hello.txt
    if guestbackup-kopia restore "$id/hello.txt" /srv/data/hello.txt >/var/tmp/restore.log 2>&1 && cmp -s /var/tmp/hello.orig /srv/data/hello.txt; then
      say "restore identical $(sha256sum </srv/data/hello.txt | cut -d' ' -f1)"
    else
      say "restore failed $(tail -n 3 /var/tmp/restore.log | tr '\n' ' ')"
    fi
    printf 'second version\n' >/srv/data/hello.txt
    guestbackup-kopia snapshot create /srv/data >/var/tmp/versions.log 2>&1
    printf 'third version, longer\n' >/srv/data/hello.txt
    guestbackup-kopia snapshot create /srv/data >>/var/tmp/versions.log 2>&1
    say "versions $(guestbackup-kopia snapshot list --json /srv/data | grep -c '"id"') $(tail -n 1 /var/tmp/versions.log)"
    systemctl poweroff
runcmd:
- [systemd-run, --unit=report, --no-block, /usr/local/sbin/report]
`

// DBConfig is the second VM owner's cloud-config, in a Secret of their own:
// a file to back up, and a report that tries to see and restore the first
// VM's snapshot (whose ID it is given), then powers the guest off.
func DBConfig(webSnapshot string) string {
	return `#cloud-config
write_files:
- path: /srv/db/dump.sql
  content: "CREATE TABLE t (id int);\n"
- path: /usr/local/sbin/report
  permissions: '0755'
  content: |
    ` + ReportPrelude + `    say "snapshots $(guestbackup-kopia snapshot list --json /srv/db | grep -c '"id"')"
    say "visible $(guestbackup-kopia snapshot list --all --json | grep -c '"id"')"
    say "mine $(guestbackup-kopia snapshot list --json db@team-a:/srv/db 2>/dev/null | grep -c '"id"')"
    say "others $(guestbackup-kopia snapshot list --json web@team-a:/srv/data 2>/dev/null | grep -c '"id"')"
    if guestbackup-kopia restore "$(snapshot_id /srv/db)/dump.sql" /var/tmp/own.sql >/var/tmp/own.log 2>&1 && cmp -s /srv/db/dump.sql /var/tmp/own.sql; then
      say "own restored"
    else
      say "own failed $(tail -n 3 /var/tmp/own.log | tr '\n' ' ')"
    fi
    if guestbackup-kopia restore ` + webSnapshot + `/hello.txt /var/tmp/stolen.txt >/var/tmp/steal.log 2>&1; then
      say "steal restored $(cat /var/tmp/stolen.txt)"
    else
      say "steal refused $(grep -i -m 1 -e error -e denied /var/tmp/steal.log)"
    fi
    systemctl poweroff
runcmd:
- [systemd-run, --unit=report, --no-block, /usr/local/sbin/report]
`
}

// Logs returns the journal lines the report printed on the console.
func Logs(console string) string {
	var logs []string
	for _, line := range strings.Split(console, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "GB-E2E-LOG "); ok {
			logs = append(logs, rest)
		}
	}
	return strings.Join(logs, "\n")
}

var marker = regexp.MustCompile(`(?m)^GB-E2E (\S+) ?(.*?)\r?$`)

// Markers are the report's "GB-E2E <marker> <value>" lines, by marker.
func Markers(console string) map[string]string {
	m := map[string]string{}
	for _, match := range marker.FindAllStringSubmatch(console, -1) {
		m[match[1]] = match[2]
	}
	return m
}
