package cloudinit

import (
	"bytes"
	"errors"
	"fmt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"time"

	certutil "k8s.io/client-go/util/cert"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/rehash"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Where the bootstrap lives in a guest.
const (
	ConfDir        = "/etc/guestbackup"
	StateDir       = "/var/lib/guestbackup"
	ConnectScript  = "/usr/local/sbin/guestbackup-connect"
	SnapshotScript = "/usr/local/sbin/guestbackup-snapshot"
	// RequestsScript carries out the requests from the cluster addressed to
	// the VM (GuestSnapshot), run by RequestsUnit.
	RequestsScript = "/usr/local/sbin/guestbackup-requests"
	// RequestsOff is the guest owner's off switch: while it exists, every
	// request from the cluster fails, saying so.
	RequestsOff = "/etc/guestbackup/requests.off"
	// HooksDir holds the guest owner's consistency hooks: executables in
	// pre-snapshot.d and post-snapshot.d run around every snapshot,
	// scheduled or requested (docs/guest.md).
	HooksDir = "/etc/guestbackup/hooks"
	// KopiaCommand is kopia as the bootstrap runs it, for the owner's own
	// use: `guestbackup-kopia snapshot list`.
	KopiaCommand = "/usr/local/bin/guestbackup-kopia"
	// TrustDir holds ca.crt, the only CA kopia trusts for the server.
	TrustDir = ConfDir + "/trust"
	// LibDir holds the kopia client the guest fetched from its server
	// (LibDir/kopia), installed only once its SHA-256 is the bootstrap's.
	LibDir        = "/usr/local/lib/guestbackup"
	UnitDir       = "/etc/systemd/system"
	ConnectUnit   = "guestbackup-connect.service"
	SnapshotUnit  = "guestbackup-snapshot.service"
	SnapshotTimer = "guestbackup-snapshot.timer"
	RequestsUnit  = "guestbackup-requests.service"
	// DefaultSchedule is when a guest snapshots its paths unless the VM says.
	DefaultSchedule = "daily"
	// DefaultSpread bounds the random delay of a guest's first connection
	// at boot and of its scheduled snapshots, unless the BSLS says
	// (spec.guestSpread).
	DefaultSpread = 15 * time.Minute
	// MaxSpread bounds Spread: a day, the period of the default schedule.
	MaxSpread = 24 * time.Hour
	// BootMarker is written, on a tmpfs, by every boot that brought the
	// bootstrap (cloud-init's bootcmd, or disk mode's install.sh): a boot
	// without it opted out, and the connect service then removes the
	// credentials and the schedule.
	BootMarker = "/run/guestbackup/bootstrap"
)

// Bootstrap is everything a guest is given to back itself up: where its
// server is, the CA it trusts, its identity and its own password. Never the
// repository password or storage credentials.
type Bootstrap struct {
	// ServerURL is the BSLS's endpoint, https://host:port.
	ServerURL string
	// CA is the PEM of the certificates that sign the server's certificate.
	// The guest verifies the server's chain to them and ServerURL's host
	// in the certificate; it trusts no other CA for the server.
	CA []byte
	// Username is the VM's Kopia identity, <vm>@<namespace>.
	Username string
	// Password is the VM's own Kopia password.
	Password string
	// Generation of the credentials; a new one makes the guest reconnect.
	Generation int64
	// Paths the guest snapshots on Schedule; none: the guest only connects.
	Paths []string
	// Schedule is a systemd OnCalendar expression; default DefaultSchedule.
	Schedule string
	// Spread bounds the random delay before the guest's first connection
	// at boot and before each scheduled snapshot (systemd's
	// RandomizedDelaySec), so that guests restarted together do not log
	// in together: Kopia's server verifies one login at a time. Zero:
	// DefaultSpread; negative: none.
	Spread time.Duration
	// Client is the kopia client the server hands out (its status.client):
	// a guest without a kopia of that build fetches it from Client.URL and
	// runs it only when its SHA-256 is the one given here. Nil: the guest
	// uses the kopia it has.
	Client *v1alpha1.ClientStatus
	// RequestPoll is how often the guest polls its server's client port
	// for requests from the cluster (the BSLS's
	// status.requestPollInterval); zero, or without Client: it does not.
	RequestPoll time.Duration
}

// polls reports whether the guest polls for requests: it needs the client
// port, which serves them.
func (b Bootstrap) polls() bool { return b.RequestPoll > 0 && b.Client != nil }

// SpreadOf is the Bootstrap.Spread of a BSLS's spec.guestSpread: unset is
// the default, 0s none.
func SpreadOf(d *metav1.Duration) time.Duration {
	switch {
	case d == nil:
		return 0
	case d.Duration <= 0:
		return -1
	}
	return d.Duration
}

// spreadSeconds is Spread in whole seconds, as systemd and the connect
// script take it.
func (b Bootstrap) spreadSeconds() int64 {
	switch {
	case b.Spread == 0:
		return int64(DefaultSpread / time.Second)
	case b.Spread < 0:
		return 0
	}
	return int64(min(b.Spread, MaxSpread) / time.Second)
}

// connectSpreadSeconds is the bound of the delay before a boot's first
// connection: only a Spread the admin set. The default spreads the
// snapshot timer alone, so that a VM started on its own connects at once
// (its guest is judged by GuestNotConnected from its start); an admin who
// expects mass restarts sets guestSpread and spreads connections too.
func (b Bootstrap) connectSpreadSeconds() int64 {
	if b.Spread <= 0 {
		return 0
	}
	return b.spreadSeconds()
}

// File is one file of the bootstrap, as it lands in the guest.
type File struct {
	Path    string
	Mode    uint32
	Content []byte
}

var (
	schedulePattern = regexp.MustCompile(`^[A-Za-z0-9 *:,./~+-]{1,64}$`)
)

// ParsePaths reads the guestbackup.io/paths annotation: absolute paths,
// separated by commas or newlines.
func ParsePaths(value string) ([]string, error) {
	var paths []string
	for _, p := range strings.FieldsFunc(value, func(r rune) bool { return r == ',' || r == '\n' }) {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !path.IsAbs(p) || strings.ContainsAny(p, "\x00\r") {
			return nil, fmt.Errorf("path %q is not an absolute path", p)
		}
		paths = append(paths, path.Clean(p))
	}
	return paths, nil
}

// SnapshotRequest is the request that carries GuestSnapshot s to the guest
// of the VM whose annotations are vmAnnotations: s's paths, else the VM's
// guestbackup.io/paths (userset.SnapshotRequest). Its error says, for the
// request's status, why s cannot be carried.
func SnapshotRequest(s *v1alpha1.GuestSnapshot, vmAnnotations map[string]string) (userset.Request, error) {
	vmPaths, err := ParsePaths(vmAnnotations[v1alpha1.AnnotationPaths])
	if err != nil && len(s.Spec.Paths) == 0 {
		return userset.Request{}, fmt.Errorf("the VM's annotation %s is not valid (%w), and the request names no path: fix the annotation or set spec.paths", v1alpha1.AnnotationPaths, err)
	}
	return userset.SnapshotRequest(s, vmPaths)
}

// ValidateSchedule checks a systemd OnCalendar expression for characters
// that could break out of the timer unit; systemd itself judges the rest.
func ValidateSchedule(s string) error {
	if !schedulePattern.MatchString(s) {
		return fmt.Errorf("schedule %q is not a systemd calendar expression (like daily, hourly or *-*-* 02:00:00)", s)
	}
	return nil
}

// Validate checks what the bootstrap would write into a guest.
func (b Bootstrap) Validate() error {
	u, err := url.Parse(b.ServerURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || strings.ContainsAny(b.ServerURL, "'\"\\ \n") {
		return fmt.Errorf("server URL %q is not an https:// URL", b.ServerURL)
	}
	if _, err := certutil.ParseCertsPEM(b.CA); err != nil {
		return fmt.Errorf("server CA: %w", err)
	}
	if err := identity.ValidateUsername(b.Username); err != nil {
		return err
	}
	if len(b.Password) < 16 || strings.ContainsAny(b.Password, "\x00\n") {
		return errors.New("password: want at least 16 characters on one line")
	}
	for _, p := range b.Paths {
		if !path.IsAbs(p) || strings.ContainsAny(p, "\x00\n\r") {
			return fmt.Errorf("path %q is not an absolute path", p)
		}
	}
	if err := b.validateClient(); err != nil {
		return err
	}
	if b.RequestPoll < 0 || b.RequestPoll%time.Second != 0 {
		return fmt.Errorf("request poll interval %s is not a whole number of seconds", b.RequestPoll)
	}
	if b.Schedule != "" {
		return ValidateSchedule(b.Schedule)
	}
	return nil
}

// validateClient checks the client, when there is one.
func (b Bootstrap) validateClient() error {
	c := b.Client
	if c == nil {
		return nil
	}
	if err := clientdist.Validate(c); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if u, err := url.Parse(c.URL); err != nil || u.Scheme != "https" || u.Host == "" || u.Path != "" || strings.ContainsAny(c.URL, "'\"\\ \n?#") {
		return fmt.Errorf("client URL %q is not an https://host:port URL", c.URL)
	}
	return nil
}

// Files renders the bootstrap's files, in a fixed order.
func (b Bootstrap) Files() ([]File, error) {
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	user, host, _ := strings.Cut(b.Username, "@")
	var conf bytes.Buffer
	fmt.Fprintf(&conf, "# Written by guestbackup: how this VM reaches its backup server.\n")
	settings := [][2]string{
		{"GUESTBACKUP_SERVER_URL", b.ServerURL},
		{"GUESTBACKUP_USER", user},
		{"GUESTBACKUP_HOST", host},
		{"GUESTBACKUP_GENERATION", strconv.FormatInt(b.Generation, 10)},
	}
	if c := b.Client; c != nil {
		settings = append(settings, [2]string{"GUESTBACKUP_CLIENT_URL", c.URL}, [2]string{"GUESTBACKUP_CLIENT_VERSION", c.Version})
		for _, arch := range clientdist.Archs {
			if sum := c.SHA256[arch]; sum != "" {
				settings = append(settings, [2]string{"GUESTBACKUP_CLIENT_SHA256_" + strings.ToUpper(arch), sum})
			}
		}
	}
	for _, kv := range settings {
		// Values are validated above: no quote can end the string.
		fmt.Fprintf(&conf, "%s='%s'\n", kv[0], kv[1])
	}
	// Re-encoded: the guest gets certificates and nothing else.
	cas, _ := certutil.ParseCertsPEM(b.CA) // validated above
	trust := pki.EncodeCerts(cas...)
	files := []File{
		{Path: ConfDir + "/guestbackup.conf", Mode: 0o600, Content: conf.Bytes()},
		// No newline: in disk mode this file is the Secret's own password key.
		{Path: ConfDir + "/password", Mode: 0o600, Content: []byte(b.Password)},
		{Path: TrustDir + "/ca.crt", Mode: 0o644, Content: trust},
		{Path: KopiaCommand, Mode: 0o755, Content: []byte(kopiaCommand)},
		{Path: ConnectScript, Mode: 0o755, Content: []byte(connectScript)},
		{Path: UnitDir + "/" + ConnectUnit, Mode: 0o644, Content: fmt.Appendf(nil, connectUnit, b.connectSpreadSeconds())},
	}
	if len(b.Paths) > 0 {
		schedule := b.Schedule
		if schedule == "" {
			schedule = DefaultSchedule
		}
		var timer bytes.Buffer
		if err := timerUnit.Execute(&timer, struct {
			Schedule string
			Spread   int64
		}{schedule, b.spreadSeconds()}); err != nil {
			return nil, fmt.Errorf("render timer: %w", err)
		}
		files = append(files,
			File{Path: ConfDir + "/paths", Mode: 0o600, Content: []byte(strings.Join(b.Paths, "\n") + "\n")},
			File{Path: SnapshotScript, Mode: 0o755, Content: []byte(snapshotScript)},
			File{Path: UnitDir + "/" + SnapshotUnit, Mode: 0o644, Content: []byte(snapshotUnit)},
			File{Path: UnitDir + "/" + SnapshotTimer, Mode: 0o644, Content: timer.Bytes()},
		)
	}
	if b.polls() {
		files = append(files,
			File{Path: RequestsScript, Mode: 0o755, Content: []byte(requestsScript)},
			File{Path: UnitDir + "/" + RequestsUnit, Mode: 0o644, Content: fmt.Appendf(nil, requestsUnit, int64(b.RequestPoll/time.Second))},
		)
	}
	return files, nil
}

// Units are the systemd units to enable, in order, once the files are in
// place.
func (b Bootstrap) Units() []string {
	units := []string{ConnectUnit}
	if len(b.Paths) > 0 {
		units = append(units, SnapshotTimer)
	}
	if b.polls() {
		units = append(units, RequestsUnit)
	}
	return units
}

// snapshotFiles are the files only a bootstrap with paths has.
var snapshotFiles = []string{ConfDir + "/paths", SnapshotScript, UnitDir + "/" + SnapshotUnit, UnitDir + "/" + SnapshotTimer}

// requestsFiles are the files only a bootstrap that polls for requests has.
var requestsFiles = []string{RequestsScript, UnitDir + "/" + RequestsUnit}

// activation is the shell that follows the files' installation at every
// boot, in both deliveries: it marks the boot as one that brought the
// bootstrap, drops what an earlier bootstrap with paths left when this one
// has none, and (re)starts the units without waiting for them (they are
// ordered after the boot step that runs it, so waiting would hang the
// boot). A changed file takes effect at once: the connect service
// reconnects when its configuration changed.
func (b Bootstrap) activation() string {
	var sh strings.Builder
	fmt.Fprintf(&sh, "mkdir -p \"$root\"%s && echo %d >\"$root\"%s\n", path.Dir(BootMarker), b.Generation, BootMarker)
	if len(b.Paths) == 0 {
		fmt.Fprintf(&sh, "[ -n \"$root\" ] || ! [ -d /run/systemd/system ] || systemctl disable --now %s >/dev/null 2>&1 || true\n", SnapshotTimer)
		fmt.Fprintf(&sh, "rm -f%s\n", rootPrefixed(snapshotFiles...))
	}
	if !b.polls() {
		fmt.Fprintf(&sh, "[ -n \"$root\" ] || ! [ -d /run/systemd/system ] || systemctl disable --now %s >/dev/null 2>&1 || true\n", RequestsUnit)
		fmt.Fprintf(&sh, "rm -f%s\n", rootPrefixed(requestsFiles...))
	}
	// $root is set for tests only: systemd is the guest's.
	sh.WriteString("if [ -z \"$root\" ] && [ -d /run/systemd/system ]; then\n")
	sh.WriteString("  systemctl daemon-reload\n")
	fmt.Fprintf(&sh, "  systemctl enable %s\n", strings.Join(b.Units(), " "))
	fmt.Fprintf(&sh, "  systemctl restart --no-block %s\n", strings.Join(b.Units(), " "))
	sh.WriteString("fi\n")
	return sh.String()
}

// trustEnv makes kopia trust the server's CA and nothing else. Without
// --server-cert-fingerprint, kopia lets Go verify the server's chain and
// host name against the system roots, which Go reads from these two
// variables; naming the trust folder in both keeps the image's public CAs
// out. Kopia's fingerprint pin is never used: it accepts any chain that
// merely contains the pinned certificate, and the CA's certificate is
// public (docs/security.md).
const trustEnv = `export SSL_CERT_FILE="$conf_dir/trust/ca.crt" SSL_CERT_DIR="$conf_dir/trust"
`

// useKopia picks the kopia the scripts run: the client guestbackup-connect
// installed after verifying it, else the guest's own.
const useKopia = `lib_dir=${GUESTBACKUP_LIB_DIR:-` + LibDir + `}
kopia=${KOPIA:-kopia}
if [ -x "$lib_dir/kopia" ]; then kopia="$lib_dir/kopia"; fi
`

// kopiaCommand is kopia with the bootstrap's environment, for the owner.
const kopiaCommand = `#!/bin/sh
# guestbackup-kopia: kopia as guestbackup connected it, trusting only this
# VM's backup server. Use it as kopia: guestbackup-kopia snapshot list
conf_dir=${GUESTBACKUP_CONF_DIR:-` + ConfDir + `}
` + useKopia + `export HOME="${HOME:-/root}"
export KOPIA_CHECK_FOR_UPDATES=false
` + trustEnv + `exec "$kopia" "$@"
`

// connectScript connects the guest's kopia (root's default configuration,
// so KopiaCommand works as is) using only the injected files. It is
// idempotent: connected with the files as they are, it does nothing; any
// change to them (credentials, server, CA, paths) connects again. At a boot
// that brought no bootstrap (BootMarker is missing: the VM opted out) it
// disconnects and removes the credentials, the schedule and itself. The
// password reaches kopia through its environment only.
var connectScript = `#!/bin/sh
# guestbackup-connect: connects this VM's kopia to its guestbackup server,
# using only what guestbackup injected into ` + ConfDir + `.
set -u
conf_dir=${GUESTBACKUP_CONF_DIR:-` + ConfDir + `}
state_dir=${GUESTBACKUP_STATE_DIR:-` + StateDir + `}
lib_dir=${GUESTBACKUP_LIB_DIR:-` + LibDir + `}
# GUESTBACKUP_ROOT: the root the files are under, for tests; "" in a guest.
root=${GUESTBACKUP_ROOT:-}
boot_marker="$root` + BootMarker + `"
attempts=${GUESTBACKUP_ATTEMPTS:-40}
kopia=${KOPIA:-kopia}
export HOME="${HOME:-/root}"
export KOPIA_CHECK_FOR_UPDATES=false
` + trustEnv + `
log() { printf 'guestbackup: %s\n' "$*"; }
# mark records the outcome where an admin or the owner looks first.
mark() {
  mkdir -p "$state_dir" && chmod 0700 "$state_dir"
  printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >"$state_dir/status"
  log "$*"
}

# A boot that brought no bootstrap is one after the VM opted out: the guest
# stops backing up. Its snapshots stay on the server.
if [ ! -e "$boot_marker" ]; then
  "$kopia" repository disconnect >/dev/null 2>&1 || true
  [ -x "$lib_dir/kopia" ] && "$lib_dir/kopia" repository disconnect >/dev/null 2>&1
  if [ -z "$root" ] && [ -d /run/systemd/system ]; then
    systemctl disable --now ` + SnapshotTimer + ` ` + RequestsUnit + ` >/dev/null 2>&1 || true
    systemctl disable ` + ConnectUnit + ` >/dev/null 2>&1 || true
  fi
  # The owner's hooks and off switch stay; guestbackup's files go.
  rm -rf "$conf_dir/trust" "$conf_dir/guestbackup.conf" "$conf_dir/password" "$conf_dir/paths" "$state_dir/connected" "$lib_dir"
  rmdir "$conf_dir" 2>/dev/null
  rm -f` + rootPrefixed(KopiaCommand, ConnectScript, SnapshotScript, RequestsScript, UnitDir+"/"+SnapshotUnit, UnitDir+"/"+SnapshotTimer, UnitDir+"/"+RequestsUnit, UnitDir+"/"+ConnectUnit) + `
  [ -z "$root" ] && [ -d /run/systemd/system ] && systemctl daemon-reload
  mark "opted out: this boot brought no guestbackup bootstrap, so its credentials and schedule are removed; the snapshots stay on the server"
  exit 0
fi

# shellcheck source=/dev/null
. "$conf_dir/guestbackup.conf"
who="$GUESTBACKUP_USER@$GUESTBACKUP_HOST"
# What the connection was made with: any change (credentials, server, CA,
# client, paths) makes it again, and takes a first snapshot of the new paths.
connected=$(cat "$conf_dir/guestbackup.conf" "$conf_dir/password" "$conf_dir/trust/ca.crt" "$conf_dir/paths" 2>/dev/null | sha256sum | cut -d' ' -f1)

# sha256 prints the SHA-256 of file $1, "" when it cannot be read.
sha256() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }

# fetch URL FILE downloads URL into FILE trusting the server's CA and no
# other, with whichever of curl, wget and python3 (which cloud-init needs)
# the guest has.
fetch() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --retry 3 --retry-delay 5 --cacert "$conf_dir/trust/ca.crt" -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then
    wget -q --tries=3 --ca-certificate="$conf_dir/trust/ca.crt" --ca-directory="$conf_dir/trust" -O "$2" "$1"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'import shutil, ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[3])
with urllib.request.urlopen(sys.argv[1], context=ctx, timeout=300) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f)' "$1" "$2" "$conf_dir/trust/ca.crt"
  else
    echo "no curl, wget or python3 to download with" >&2
    return 1
  fi
}

` + reportFunc + `
# use_client makes kopia the client the server hands out, verified: the one
# installed in $lib_dir, the guest's own when it is that very build, or a
# download. It returns 1 when it cannot have it yet (why says why) and 2
# when it refused a binary (recorded and reported). Without a client for
# this architecture in the bootstrap, the guest's own kopia is used.
use_client() {
  case $(uname -m) in
  x86_64 | amd64) arch=amd64 want=${GUESTBACKUP_CLIENT_SHA256_AMD64:-} ;;
  aarch64 | arm64) arch=arm64 want=${GUESTBACKUP_CLIENT_SHA256_ARM64:-} ;;
  *) arch=$(uname -m) want="" ;;
  esac
  if [ -z "$want" ]; then
    command -v "$kopia" >/dev/null 2>&1 && return 0
    mark "error: kopia is not installed in this guest and its server hands out none for $arch; install the kopia CLI, then run: systemctl restart guestbackup-connect"
    exit 1
  fi
  if ! command -v sha256sum >/dev/null 2>&1; then
    mark "error: sha256sum is missing, so the kopia client cannot be verified and is not used; install coreutils"
    exit 1
  fi
  if [ "$(sha256 "$lib_dir/kopia")" = "$want" ]; then
    kopia="$lib_dir/kopia"
    return 0
  fi
  mkdir -p "$lib_dir" && chmod 0755 "$lib_dir"
  new="$lib_dir/kopia.new"
  rm -f "$new"
  # Every binary is verified where it will run from, so nothing else is
  # ever executed. The guest's own kopia is copied first and the copy
  # verified: when it is that very build it saves a download, and its
  # bytes are hashed once (seconds of an emulated guest's first boot).
  own=$(command -v "$kopia" 2>/dev/null)
  if [ -n "$own" ] && cp "$own" "$new" 2>/dev/null && [ "$(sha256 "$new")" = "$want" ]; then
    from="this guest's $own"
  else
    rm -f "$new"
    from="$GUESTBACKUP_CLIENT_URL/kopia/linux-$arch"
    log "fetching kopia ${GUESTBACKUP_CLIENT_VERSION:-} for $arch from $from"
    if ! fetch "$from" "$new" 2>"$state_dir/fetch.log"; then
      rm -f "$new"
      why="cannot download the kopia client from $from: $(tail -n 1 "$state_dir/fetch.log")"
      return 1
    fi
    got=$(sha256 "$new")
    if [ "$got" != "$want" ]; then
      rm -f "$new"
      mark "error: refused the kopia client from $from: its SHA-256 is $got, not $want as this VM's bootstrap says; it was not run"
      report ` + clientdist.ReportChecksumMismatch + ` "refused the kopia client from $from: its SHA-256 is $got, not $want; it was not run"
      return 2
    fi
  fi
  chmod 0755 "$new" && mv -f "$new" "$lib_dir/kopia" || return 1
  log "installed kopia ${GUESTBACKUP_CLIENT_VERSION:-} ($want) from $from in $lib_dir"
  kopia="$lib_dir/kopia"
}

mkdir -p "$state_dir" && chmod 0700 "$state_dir"
why=""
use_client
client=$?
[ "$client" -eq 2 ] && exit 1
if [ "$client" -eq 0 ] && [ "$(cat "$state_dir/connected" 2>/dev/null)" = "$connected" ] &&
  "$kopia" repository status >/dev/null 2>&1; then
  log "already connected to $GUESTBACKUP_SERVER_URL as $who"
  exit 0
fi

spread=${GUESTBACKUP_SPREAD:-0}
[ "$spread" -gt 0 ] && sleep $(($(od -An -N2 -tu2 /dev/urandom) % spread))
delay=2
attempt=1
while :; do
  if [ "$client" -ne 0 ]; then
    use_client
    client=$?
    [ "$client" -eq 2 ] && exit 1
  fi
  if [ "$client" -eq 0 ]; then
    if KOPIA_PASSWORD="$(cat "$conf_dir/password")" "$kopia" repository connect server \
      --url="$GUESTBACKUP_SERVER_URL" \
      --override-username="$GUESTBACKUP_USER" \
      --override-hostname="$GUESTBACKUP_HOST" >"$state_dir/connect.log" 2>&1; then
      echo "$connected" >"$state_dir/connected"
      mark "connected to $GUESTBACKUP_SERVER_URL as $who (credentials generation $GUESTBACKUP_GENERATION)"
      # A first snapshot right away, not at the first timer tick.
      if [ -s "$conf_dir/paths" ] && [ -d /run/systemd/system ]; then
        systemctl start --no-block ` + SnapshotUnit + ` || true
      fi
      exit 0
    fi
    why=$(tail -n 1 "$state_dir/connect.log")
  fi
  if [ "$attempt" -ge "$attempts" ]; then
    if [ "$client" -ne 0 ]; then
      mark "error: no kopia client after $attempt attempts: $why"
      report ` + clientdist.ReportDownloadFailed + ` "$why"
    else
      mark "error: cannot connect to $GUESTBACKUP_SERVER_URL as $who after $attempt attempts: $why"
    fi
    exit 1
  fi
  # Backs off, with jitter: a refused or slow login is not retried by every
  # guest at the same moment.
  wait=$((delay + $(od -An -N2 -tu2 /dev/urandom) % delay))
  log "attempt $attempt to connect to $GUESTBACKUP_SERVER_URL failed ($why); retrying in ${wait}s"
  sleep "$wait"
  attempt=$((attempt + 1))
  delay=$((delay * 2))
  [ "$delay" -gt 60 ] && delay=60
done
`

// rootPrefixed lists paths for a shell command, each under $root.
func rootPrefixed(paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		b.WriteString(` "$root"` + p)
	}
	return b.String()
}

// snapshotScript snapshots each configured path; one failing path does
// not stop the others, but fails the run.
const snapshotScript = `#!/bin/sh
# guestbackup-snapshot: snapshots the paths guestbackup was told to back up.
set -u
conf_dir=${GUESTBACKUP_CONF_DIR:-` + ConfDir + `}
state_dir=${GUESTBACKUP_STATE_DIR:-` + StateDir + `}
` + useKopia + `export HOME="${HOME:-/root}"
export KOPIA_CHECK_FOR_UPDATES=false
` + trustEnv + `
# shellcheck source=/dev/null
. "$conf_dir/guestbackup.conf"
who="$GUESTBACKUP_USER@$GUESTBACKUP_HOST"
log() { printf 'guestbackup: %s\n' "$*"; }
` + reportFunc + hooksFunc + `
mkdir -p "$state_dir" && chmod 0700 "$state_dir"
paths=$(cat "$conf_dir/paths")
# The owner's pre-snapshot hooks (a database's flush, a freeze): one that
# fails aborts the snapshot, which an Event on the VM says; the
# post-snapshot hooks run whatever happened.
if ! hooks pre "$paths" ""; then
  why=$hook_failure
  echo "guestbackup: $why; no snapshot taken" >&2
  report ` + clientdist.ReportHookFailed + ` "$why"
  hooks post "$paths" ""
  date -u +%Y-%m-%dT%H:%M:%SZ >"$state_dir/last-snapshot-attempt"
  exit 1
fi
status=0
# The server names this guest in a rehash notice when the storage lost
# data that its latest snapshot references: unchanged files would keep
# pointing at it, so every file is read again, and what was lost is
# uploaded again. A server that has none, or an older one, lists nothing.
force=""
if "$kopia" manifest list --filter=type:` + rehash.ManifestType + ` 2>/dev/null | grep -q .; then
  force="--force-hash=100"
  echo "guestbackup: the server asks to read every file again: the storage lost data the latest snapshot references"
fi
while IFS= read -r path; do
  [ -n "$path" ] || continue
  if "$kopia" snapshot create ${force:+"$force"} "$path"; then
    echo "guestbackup: snapshot of $path taken"
  else
    echo "guestbackup: snapshot of $path failed" >&2
    status=1
  fi
done <"$conf_dir/paths"
hooks post "$paths" "" || true
date -u +%Y-%m-%dT%H:%M:%SZ >"$state_dir/last-snapshot-attempt"
exit "$status"
`

// connectUnit runs the connect script at every boot, without holding the
// boot up while the server is unreachable.
const connectUnit = `[Unit]
Description=Connect kopia to this VM's guestbackup server
Documentation=https://github.com/guestbackup/guestbackup
Wants=network-online.target
# After the boot step that installs this boot's bootstrap, if any.
After=network-online.target cloud-init.service guestbackup-disk.service

[Service]
Type=simple
Environment=HOME=/root
# The first connection of a boot waits a random delay up to this many
# seconds (the BSLS's spec.guestSpread), so that guests started together
# do not log in together.
Environment=GUESTBACKUP_SPREAD=%d
ExecStart=` + ConnectScript + `

[Install]
WantedBy=multi-user.target
`

const snapshotUnit = `[Unit]
Description=Snapshot this VM's guestbackup paths with kopia
Wants=network-online.target
After=network-online.target ` + ConnectUnit + `

[Service]
Type=oneshot
Environment=HOME=/root
Environment=GUESTBACKUP_ATTEMPTS=3
ExecStartPre=` + ConnectScript + `
ExecStart=` + SnapshotScript + `
`

var timerUnit = template.Must(template.New("timer").Parse(`[Unit]
Description=Snapshot this VM's guestbackup paths on schedule

[Timer]
OnCalendar={{.Schedule}}
Persistent=true
# Spread over the BSLS's spec.guestSpread: guests on one schedule do not
# log in to their server at once.
RandomizedDelaySec={{.Spread}}

[Install]
WantedBy=timers.target
`))

// requestsScript carries out the requests from the cluster addressed to
// this VM (GuestSnapshot, GuestRestore; docs/requests.md): it polls its server's client
// port as the VM's Kopia user (a returning guest's poll costs the server
// no password hash), takes what it is asked, one request at a time, and
// answers each; the server checks an answer against the repository. What
// a person wrote (paths, tags, description) arrives base64-encoded and is
// only ever passed to kopia as data. The password reaches curl or wget in
// a header file, never in their arguments.
var requestsScript = `#!/bin/sh
# guestbackup-requests: carries out the requests from the cluster
# (GuestSnapshot, GuestRestore) addressed to this VM. To turn them off, create
# ` + RequestsOff + `: each request then fails, saying so.
set -u
conf_dir=${GUESTBACKUP_CONF_DIR:-` + ConfDir + `}
state_dir=${GUESTBACKUP_STATE_DIR:-` + StateDir + `}
off=${GUESTBACKUP_REQUESTS_OFF:-` + RequestsOff + `}
poll=${GUESTBACKUP_REQUEST_POLL:-30}
hold=${GUESTBACKUP_REQUEST_HOLD:-` + strconv.Itoa(int(clientdist.MaxPollWait.Seconds())) + `}
call_timeout=60
` + useKopia + `export HOME="${HOME:-/root}"
export KOPIA_CHECK_FOR_UPDATES=false
` + trustEnv + `
log() { printf 'guestbackup: %s\n' "$*"; }

# shellcheck source=/dev/null
. "$conf_dir/guestbackup.conf"
who="$GUESTBACKUP_USER@$GUESTBACKUP_HOST"
work="$state_dir/requests"
mkdir -p "$work" && chmod 0700 "$work"
` + hooksFunc + `
# header writes the Authorization header of this VM's Kopia user.
header() {
  (umask 077 && printf 'Authorization: Basic %s\n' "$(printf '%s:%s' "$who" "$(cat "$conf_dir/password")" | base64 | tr -d '\n')" >"$work/header")
}

# call URL OUT [BODY]: a GET, or a POST of file BODY, trusting the
# server's CA and no other, with whichever of curl, wget and python3
# (which cloud-init needs) the guest has, for at most $call_timeout
# seconds; the answer goes to file OUT.
call() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --max-time "$call_timeout" --cacert "$conf_dir/trust/ca.crt" -H @"$work/header" ${3:+--data-binary "@$3"} -o "$2" "$1" </dev/null
  elif command -v wget >/dev/null 2>&1; then
    (umask 077 && printf 'header = %s\n' "$(cat "$work/header")" >"$work/wgetrc")
    WGETRC="$work/wgetrc" wget -q -T "$call_timeout" --ca-certificate="$conf_dir/trust/ca.crt" --ca-directory="$conf_dir/trust" ${3:+--post-file="$3"} -O "$2" "$1" </dev/null
  elif command -v python3 >/dev/null 2>&1; then
    GUESTBACKUP_CALL_TIMEOUT=$call_timeout python3 -c 'import os, ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2])
name, value = open(sys.argv[3]).read().strip().split(": ", 1)
data = open(sys.argv[5], "rb").read() if len(sys.argv) > 5 else None
req = urllib.request.Request(sys.argv[1], data=data, headers={name: value})
with urllib.request.urlopen(req, context=ctx, timeout=int(os.environ["GUESTBACKUP_CALL_TIMEOUT"])) as r:
    body = r.read()
with open(sys.argv[4], "wb") as f:
    f.write(body)' "$1" "$conf_dir/trust/ca.crt" "$work/header" "$2" ${3:+"$3"} </dev/null
  else
    echo "no curl, wget or python3 to reach the server with" >&2
    return 1
  fi
}

# answer UID PHASE MESSAGE [OUT] tells the server where this guest is with
# a request, keeping its answer in file OUT; the last ending it told is in
# $work/answered, for the owner. An ending is kept in $work/ended/UID
# before it is told: one the server did not hear is told again when the
# request is listed again (take), and the request is not carried out twice.
answer() {
  printf '%s' "$3" >"$work/answer.txt"
  if [ "$2" != Running ]; then
    mkdir -p "$work/ended" && printf '%s\n%s' "$2" "$3" >"$work/ended/$1"
  fi
  if ! call "$GUESTBACKUP_CLIENT_URL/requests/result?uid=$1&phase=$2" "${4:-/dev/null}" "$work/answer.txt" 2>"$work/answer.err"; then
    log "could not tell the server that request $1 is $2: $(tail -n 1 "$work/answer.err")"
    return 1
  fi
  [ "$2" = Running ] && return 0
  echo "$1 $2" >"$work/answered"
  log "answered request $1: $2"
}

# told_again UID tells the server again the ending this guest kept for
# request UID, if it kept one: the request ended here, and is not carried
# out again.
told_again() {
  [ -f "$work/ended/$1" ] || return 1
  log "request $1 ended here already: telling the server again"
  answer "$1" "$(head -n 1 "$work/ended/$1")" "$(tail -n +2 "$work/ended/$1")" || :
}

# forget_told forgets the endings of requests the server no longer lists:
# it heard them.
forget_told() {
  for f in "$work"/ended/*; do
    [ -f "$f" ] || continue
    grep -q "^request ${f##*/} " "$work/poll" || rm -f "$f"
  done
}

# snapshot UID NAME snapshots the paths in $work/paths, each with the
# request's tag, the tags in $work/tags and the description.
snapshot() {
  if [ -e "$off" ]; then
    log "request $2 refused: $off exists"
    answer "$1" Failed "remote requests are turned off in this guest ($off exists): its owner must remove that file to allow them"
    return
  fi
  # Started only once the server knows: a request withdrawn since the
  # poll (deleted) is not found, and is not carried out.
  answer "$1" Running "" || return 0
  log "taking the snapshots request $2 asks for"
  paths=$(cat "$work/paths")
  if ! hooks pre "$paths" "$2"; then
    why=$hook_failure
    hooks post "$paths" "$2"
    answer "$1" Failed "$why; no snapshot taken"
    return
  fi
  failed=""
  while IFS= read -r path; do
    set -- "$1" "$2" "--tags=` + userset.RequestTag + `:$1"
    while IFS= read -r tag; do set -- "$@" "--tags=$tag"; done <"$work/tags"
    if [ -s "$work/description" ]; then set -- "$@" "--description=$(cat "$work/description")"; fi
    uid=$1 name=$2
    shift 2
    if "$kopia" snapshot create "$@" "$path" </dev/null >"$work/snapshot.log" 2>&1; then
      log "snapshot of $path taken for request $name"
    else
      failed="$failed; $path: $(tail -n 1 "$work/snapshot.log")"
    fi
    set -- "$uid" "$name"
  done <"$work/paths"
  hooks post "$paths" "$2" || true
  if [ -z "$failed" ]; then
    answer "$1" Succeeded ""
  else
    answer "$1" Failed "the snapshot failed in the guest${failed#;}"
  fi
}

# restore UID NAME restores what the server chose when the request
# started (its answer to Running, package clientdist's EncodePlan): each
# path under $target at its full path, where nothing is yet, or over itself
# with $in_place. Outside in place, no folder on the way may be a symbolic
# link, so that nothing a snapshot holds leads the restore out of $target.
restore() {
  if [ -e "$off" ]; then
    log "request $2 refused: $off exists"
    answer "$1" Failed "remote requests are turned off in this guest ($off exists): its owner must remove that file to allow them"
    return
  fi
  answer "$1" Running "" "$work/plan" || return 0
  if ! grep -q '^from ' "$work/plan"; then
    answer "$1" Failed "the server named nothing to restore: ask again, or tell the server's admin"
    return
  fi
  log "restoring what request $2 asks for"
  failed="" restored="" count=0 steps=$(grep -c '^from ' "$work/plan")
  while read -r word source dest; do
    [ "$word" = from ] || continue
    source=$(printf '%s' "$source" | base64 -d) path=$(printf '%s' "$dest" | base64 -d)
    if [ -n "$in_place" ]; then
      dest=$(in_place "$path")
    else
      dest=$(fresh "$target" "$path")
    fi || {
      failed="$failed; $path: $dest"
      continue
    }
    if "$kopia" restore "$source" "$dest" </dev/null >"$work/restore.log" 2>&1; then
      log "restored $path to $dest for request $2"
      restored="$restored; $path: $(grep '^Restored' "$work/restore.log" | tail -n 1)"
      count=$((count + 1))
      # How far it got, for the request's status; the ending tells the
      # rest, and tells it whatever this call did.
      if [ -z "$failed" ] && [ "$count" -lt "$steps" ]; then
        call "$GUESTBACKUP_CLIENT_URL/requests/result?uid=$1&phase=Running&` + clientdist.RestoredParam + `=$count" /dev/null /dev/null 2>"$work/answer.err" ||
          log "could not tell the server how far request $2 got: $(tail -n 1 "$work/answer.err")"
      fi
    else
      failed="$failed; $path: $(tail -n 1 "$work/restore.log")"
    fi
  done <"$work/plan"
  if [ -z "$failed" ]; then
    answer "$1" Succeeded "${restored#; }"
  else
    answer "$1" Failed "the restore failed in the guest:${failed#;}"
  fi
}

# root_only DIR [ABOVE] succeeds when folder DIR is one only root may
# change: root's, and writable by no one else; with ABOVE (a folder above
# the restore's own), sticky too, as /tmp is, which keeps others from
# moving what is not theirs.
root_only() {
  perm=000$(stat -c %a "$1") && owner=$(stat -c %u "$1") || return 1
  perm=${perm#"${perm%????}"}
  [ "$owner" = 0 ] || return 1
  case ${perm#??} in *[2367]*) ;; *) return 0 ;; esac
  [ -n "${2:-}" ] || return 1
  case ${perm%???} in [1357]) return 0 ;; esac
  return 1
}

# fresh TARGET PATH makes the folders of TARGET/PATH above it and prints
# TARGET/PATH, or prints why not. No folder on the way, from / down, may
# be a symbolic link or one others may change (root_only; sticky only
# above TARGET), so that nothing leads the restore elsewhere while it
# writes as root; the folders it makes are root's alone. It never names
# something already there: a restore outside in place overwrites nothing.
fresh() {
  at="" rest=${1#/}/${2#/} above=1
  while [ "${rest#*/}" != "$rest" ]; do
    at=$at/${rest%%/*} rest=${rest#*/}
    [ "$at" = "$1" ] && above=""
    if [ -L "$at" ]; then
      printf '%s is a symbolic link, which a restore into %s does not follow: name the folder it leads to\n' "$at" "$1"
      return 1
    elif ! [ -d "$at" ]; then
      (umask 077 && mkdir "$at") || { printf 'cannot create %s\n' "$at"; return 1; }
    elif ! root_only "$at" $above; then
      printf '%s may be changed by others than root: restore into a folder only root may change\n' "$at"
      return 1
    fi
  done
  at=$at/$rest
  if [ -e "$at" ] || [ -L "$at" ]; then
    printf '%s exists already: restore into a new folder, or in place\n' "$at"
    return 1
  fi
  printf '%s\n' "$at"
}

# in_place PATH prints PATH when a restore may write over it, or why not:
# PATH itself no symbolic link, and every folder above it one only root
# may change (root_only; sticky above its own folder), so that nothing
# leads the restore elsewhere.
in_place() {
  if [ -L "$1" ]; then
    printf '%s is a symbolic link, which a restore in place does not replace: restore it into a folder\n' "$1"
    return 1
  fi
  at="" rest=${1#/} above=1
  while [ "${rest#*/}" != "$rest" ]; do
    at=$at/${rest%%/*} rest=${rest#*/}
    [ "${rest#*/}" = "$rest" ] && above=""
    if [ -L "$at" ]; then
      printf '%s is a symbolic link, which a restore in place does not follow: restore into a folder\n' "$at"
      return 1
    elif [ -d "$at" ] && ! root_only "$at" $above; then
      printf '%s may be changed by others than root: restore into a folder instead\n' "$at"
      return 1
    fi
  done
  printf '%s\n' "$1"
}

# take reads the poll's answer (package clientdist's EncodeRequests) and
# carries out each request in turn.
take() {
  uid="" kind="" name=""
  while read -r word arg rest; do
    case $word in
    request)
      uid=$arg kind=${rest%% *} name=${rest#* } target="" in_place=""
      # A UID names a file below: the server sends UIDs only.
      case $uid in *[!0-9a-f-]* | "") uid=invalid ;; esac
      : >"$work/paths" && : >"$work/tags" && : >"$work/description"
      ;;
    path) { printf '%s' "$arg" | base64 -d && echo; } >>"$work/paths" ;;
    tag) { printf '%s' "$arg" | base64 -d && echo; } >>"$work/tags" ;;
    description) printf '%s' "$arg" | base64 -d >"$work/description" ;;
    target) target=$(printf '%s' "$arg" | base64 -d) ;;
    in-place) in_place=1 ;;
    end)
      [ "$uid" = invalid ] && continue
      told_again "$uid" && continue
      case $kind in
      ` + userset.RequestSnapshot + `) snapshot "$uid" "$name" ;;
      ` + userset.RequestRestore + `) restore "$uid" "$name" ;;
      *) answer "$uid" Failed "this guest does not know requests of kind $kind" ;;
      esac
      ;;
    esac
  done <"$work/poll"
}

# GUESTBACKUP_REQUESTS_ONCE=1: one poll, now, then exit.
while :; do
  began=$(date +%s)
  # Only once connected: kopia has the server's session then.
  if [ -s "$state_dir/connected" ]; then
    header
    # The server holds the poll until a request is addressed to this
    # guest, or for $hold seconds: one connection per hold, and a
    # request starts within seconds of its listing.
    call_timeout=$((hold + 60))
    if call "$GUESTBACKUP_CLIENT_URL/requests?` + clientdist.WaitParam + `=$hold" "$work/poll" 2>"$work/poll.err"; then
      call_timeout=60
      take
      forget_told
    else
      log "cannot ask $GUESTBACKUP_CLIENT_URL for requests: $(tail -n 1 "$work/poll.err")"
    fi
    call_timeout=60
    rm -f "$work/header" "$work/wgetrc"
  fi
  [ "${GUESTBACKUP_REQUESTS_ONCE:-}" = 1 ] && exit 0
  # A poll held for its whole hold, or one whose requests took longer
  # than the poll interval, is followed at once. One answered sooner
  # (nothing pending from a server that holds no polls, an error, a
  # request quickly done) waits out the poll interval. A clock stepped
  # back counts as no time.
  took=$(($(date +%s) - began))
  [ "$took" -lt 0 ] && took=0
  if [ "$took" -lt "$poll" ] && { [ "$hold" -eq 0 ] || [ "$took" -lt "$hold" ]; }; then
    sleep $((poll - took))
  fi
done
`

// requestsUnit keeps the requests script running; its argument is the
// poll interval in seconds.
const requestsUnit = `[Unit]
Description=Carry out the requests from the cluster addressed to this VM (guestbackup)
Documentation=https://github.com/guestbackup/guestbackup
Wants=network-online.target
After=network-online.target ` + ConnectUnit + `

[Service]
Type=simple
Environment=HOME=/root
Environment=GUESTBACKUP_REQUEST_POLL=%d
ExecStart=` + RequestsScript + `
Restart=always
RestartSec=30

[Install]
WantedBy=multi-user.target
`

// reportFunc defines report, which tells the server, as the VM's Kopia
// user, why the guest cannot back up, for an Event on the VM (package
// clientdist's reports). It needs conf_dir, state_dir, who, log and the
// bootstrap's configuration.
const reportFunc = `# report KIND MESSAGE tells the server, as this VM's Kopia user, why the
# guest cannot back up, for an Event on the VM; best effort. The password
# goes in a header file, never in a command's arguments.
report() {
  [ -n "${GUESTBACKUP_CLIENT_URL:-}" ] || return 0
  printf '%s' "$2" >"$state_dir/report.txt"
  (umask 077 && printf 'Authorization: Basic %s\n' "$(printf '%s:%s' "$who" "$(cat "$conf_dir/password")" | base64 | tr -d '\n')" >"$state_dir/report.header")
  url="$GUESTBACKUP_CLIENT_URL/report?kind=$1"
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --cacert "$conf_dir/trust/ca.crt" -H @"$state_dir/report.header" --data-binary @"$state_dir/report.txt" -o /dev/null "$url"
  elif command -v wget >/dev/null 2>&1; then
    (umask 077 && printf 'header = %s\n' "$(cat "$state_dir/report.header")" >"$state_dir/report.wgetrc")
    WGETRC="$state_dir/report.wgetrc" wget -q --ca-certificate="$conf_dir/trust/ca.crt" --ca-directory="$conf_dir/trust" --post-file="$state_dir/report.txt" -O /dev/null "$url"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -c 'import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2])
name, value = open(sys.argv[3]).read().strip().split(": ", 1)
req = urllib.request.Request(sys.argv[1], data=open(sys.argv[4], "rb").read(), headers={name: value})
urllib.request.urlopen(req, context=ctx, timeout=60).close()' "$url" "$conf_dir/trust/ca.crt" "$state_dir/report.header" "$state_dir/report.txt"
  fi >/dev/null 2>&1 && log "reported to $GUESTBACKUP_CLIENT_URL: $1"
  rm -f "$state_dir/report.header" "$state_dir/report.wgetrc" "$state_dir/report.txt"
}
`

// hooksFunc defines hooks, which runs the guest owner's consistency hooks
// around a snapshot: the executables of HooksDir/<phase>-snapshot.d, in
// name order, with GUESTBACKUP_PATHS (the paths, one per line) and
// GUESTBACKUP_REQUEST (the request's name; empty for the schedule) in
// their environment. A failing pre-snapshot hook stops the others and
// fails the call, leaving "<hook> failed: <its last output line>" in
// hook_failure; post-snapshot hooks all run whatever happened.
const hooksFunc = `# hooks PHASE PATHS REQUEST runs the owner's PHASE-snapshot hooks.
hooks() {
  hook_failure=""
  dir="${GUESTBACKUP_HOOKS_DIR:-` + HooksDir + `}/$1-snapshot.d"
  [ -d "$dir" ] || return 0
  for hook in "$dir"/*; do
    if ! [ -f "$hook" ] || ! [ -x "$hook" ]; then continue; fi
    if GUESTBACKUP_PATHS="$2" GUESTBACKUP_REQUEST="$3" "$hook" </dev/null >"$state_dir/hook.log" 2>&1; then
      log "$1-snapshot hook $(basename "$hook") ran"
    else
      hook_failure="$1-snapshot hook $(basename "$hook") failed: $(tail -n 1 "$state_dir/hook.log")"
      log "$hook_failure"
      [ "$1" = pre ] && return 1
    fi
  done
  return 0
}
`
