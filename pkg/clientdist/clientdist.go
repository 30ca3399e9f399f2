// Package clientdist is the contract of the kopia client a server pod hands
// out to its guests (docs/design.md, decision 18), shared by the server pod
// (which serves the binaries and publishes their SHA-256), the controller
// (which copies what it published into the BSLS's status) and the bootstrap
// (which carries the SHA-256 into the guest). The guest fetches
// <URL>/kopia/linux-<arch> over the server's own TLS endpoint, trusting the
// BSLS's CA only, and runs the binary only when its SHA-256 is the one its
// bootstrap carries; a guest that cannot POSTs a report to <URL>/report,
// authenticated as its Kopia user, which the server pod publishes in its
// activity for the controller's audit to turn into an Event on the VM.
// The same port carries requests (GuestSnapshot) to the guest and its
// results back (RequestsPath, ResultPath).
package clientdist

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// PortName is the name of the client port on the server pod, its Service
// and its NetworkPolicy.
const PortName = "client"

// Port is the client port beside a server port: the next one.
func Port(serverPort int32) int32 { return serverPort + 1 }

// DefaultPort is the client port of a server on v1alpha1.DefaultServerPort.
const DefaultPort = v1alpha1.DefaultServerPort + 1

// Archs are the architectures (GOARCH) a server pod serves a client for.
var Archs = []string{"amd64", "arm64"}

// ReportPath is where a guest POSTs a Report.
const ReportPath = "/report"

// DownloadPath is where the binary for arch is served.
func DownloadPath(arch string) string { return "/kopia/linux-" + arch }

// URL is the client's base URL for a server endpoint: the same scheme and
// host, the endpoint's port plus one (443 when it names none). An admin's
// clientURL that fronts the server must forward that port too.
func URL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		return "", fmt.Errorf("endpoint %q is not an https:// URL", endpoint)
	}
	port := 443
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port >= 65535 {
			return "", fmt.Errorf("endpoint %q: port %q has no next port", endpoint, p)
		}
	}
	return "https://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(port+1)), nil
}

// Key is the data key under which a server pod publishes its client (a
// ClientStatus without URL, as JSON) in the ConfigMap it publishes its
// state in for the BSLS's status (maintenancestate.ConfigMapName).
const Key = "client"

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Validate says what is wrong with a published client, nil when a
// bootstrap can carry it.
func Validate(c *v1alpha1.ClientStatus) error {
	if len(c.SHA256) == 0 {
		return fmt.Errorf("names no binary")
	}
	for _, arch := range slices.Sorted(maps.Keys(c.SHA256)) {
		if !slices.Contains(Archs, arch) {
			return fmt.Errorf("architecture %q is none of %v", arch, Archs)
		}
		if !sha256Hex.MatchString(c.SHA256[arch]) {
			return fmt.Errorf("SHA-256 of %s %q is not 64 lowercase hex digits", arch, c.SHA256[arch])
		}
	}
	if c.Version != "" && !versionPattern.MatchString(c.Version) {
		return fmt.Errorf("version %q is not a version", c.Version)
	}
	return nil
}

var versionPattern = regexp.MustCompile(`^[A-Za-z0-9.+_-]{1,64}$`)

// Encode renders what a server pod publishes under Key.
func Encode(c v1alpha1.ClientStatus) string {
	c.URL = ""                 // the controller knows the endpoint; the pod does not
	data, _ := json.Marshal(c) // plain data: cannot fail
	return string(data)
}

// Decode reads what Encode wrote; nil for "" (nothing published yet).
func Decode(data string) (*v1alpha1.ClientStatus, error) {
	if data == "" {
		return nil, nil //nolint:nilnil // nothing published is not an error
	}
	c := &v1alpha1.ClientStatus{}
	if err := json.Unmarshal([]byte(data), c); err != nil {
		return nil, fmt.Errorf("key %s: %w", Key, err)
	}
	if err := Validate(c); err != nil {
		return nil, fmt.Errorf("key %s: %w", Key, err)
	}
	return c, nil
}

// Digest identifies a published client (URL, version and sums) for the
// record of what a bootstrap was rendered with; "" for none.
func Digest(c *v1alpha1.ClientStatus) string {
	if c == nil {
		return ""
	}
	sum := sha256.Sum256([]byte(c.URL + "\n" + Encode(*c)))
	return hex.EncodeToString(sum[:])
}

// Report kinds: what went wrong with the client in a guest.
const (
	// ReportChecksumMismatch: the guest downloaded a binary whose SHA-256
	// is not its bootstrap's, and did not run it.
	ReportChecksumMismatch = "checksum-mismatch"
	// ReportDownloadFailed: the guest has no kopia of the right build and
	// could not download one.
	ReportDownloadFailed = "download-failed"
	// ReportHookFailed: an owner's pre-snapshot hook failed, so the
	// scheduled snapshot was not taken.
	ReportHookFailed = "hook-failed"
)

// ReportKinds are the kinds a server pod accepts.
var ReportKinds = []string{ReportChecksumMismatch, ReportDownloadFailed, ReportHookFailed}

// MaxReportMessage bounds a report's message: it reaches an Event.
const MaxReportMessage = 512

// KindParam is the query parameter of a report's kind; its body is the
// message, plain text (what a POSIX shell can send without quoting).
const KindParam = "kind"

// RequestsPath is where a guest GETs the requests addressed to it
// (package userset's Request), authenticated as its Kopia user, in the
// form EncodeRequests writes.
const RequestsPath = "/requests"

// WaitParam asks a requests poll to be held, for up to this many seconds
// (at most MaxPollWait), until a request is addressed to the guest: a
// guest then polls once per hold, not once per interval, and starts a
// request within seconds of its listing.
const WaitParam = "wait"

// MaxPollWait bounds how long a server holds a poll: below the idle
// timeouts of the load balancers and NAT gateways between a guest and its
// server (AWS's NLB's is 350 s), which would cut a longer one unseen.
const MaxPollWait = 240 * time.Second

// ResultPath is where a guest POSTs where it is with one request: the
// request's UID and the phase (Running, Succeeded or Failed) as query
// parameters, its message as the body, plain text.
const ResultPath = "/requests/result"

// Query parameters of a result.
const (
	UIDParam   = "uid"
	PhaseParam = "phase"
	// RestoredParam, on a restore's repeated Running, says how far it
	// got: the plan's first so many steps (EncodePlan) are restored. It
	// carries no message; the server answers it with no plan.
	RestoredParam = "restored"
)

// EncodeRequests renders requests for a POSIX shell to read line by line,
// a request at a time:
//
//	request <uid> <kind> <name>
//	path <base64 of the path>            (one per path)
//	tag <base64 of key:value>            (one per tag, sorted)
//	description <base64 of the text>     (when there is one)
//	target <base64 of the folder>        (a restore: where it writes)
//	in-place                             (a restore that may overwrite)
//	end
//
// Everything a person wrote is base64, so no path, tag or description can
// reach the guest's shell as anything but data; UIDs, kinds and names are
// validated (userset.Request.Validate) to hold no space. What a restore
// restores from is chosen when it starts (EncodePlan).
func EncodeRequests(requests []userset.Request) []byte {
	var b bytes.Buffer
	enc := base64.StdEncoding.EncodeToString
	for _, r := range requests {
		fmt.Fprintf(&b, "request %s %s %s\n", r.UID, r.Kind, r.Name)
		for _, p := range r.Paths {
			fmt.Fprintf(&b, "path %s\n", enc([]byte(p)))
		}
		for _, k := range slices.Sorted(maps.Keys(r.Tags)) {
			fmt.Fprintf(&b, "tag %s\n", enc([]byte(k+":"+r.Tags[k])))
		}
		if r.Description != "" {
			fmt.Fprintf(&b, "description %s\n", enc([]byte(r.Description)))
		}
		if r.Target != "" {
			fmt.Fprintf(&b, "target %s\n", enc([]byte(r.Target)))
		}
		if r.InPlace {
			b.WriteString("in-place\n")
		}
		b.WriteString("end\n")
	}
	return b.Bytes()
}

// PlanStep is what a restore restores of one path.
type PlanStep struct {
	// ID is the snapshot (manifest) ID; Root its source path, which holds
	// Path.
	ID, Root, Path string
}

// EncodePlan renders what a restore restores, the answer to its guest's
// Running, for a POSIX shell to read line by line, a path at a time:
//
//	from <base64 of the kopia restore source> <base64 of the path>
//
// The source is "<snapshot ID>" or "<snapshot ID>/<path below the
// snapshot's root>", as `kopia restore` takes it.
func EncodePlan(plan []PlanStep) []byte {
	var b bytes.Buffer
	enc := base64.StdEncoding.EncodeToString
	for _, step := range plan {
		source := step.ID
		if below := strings.TrimPrefix(strings.TrimPrefix(step.Path, step.Root), "/"); step.Path != step.Root && below != "" {
			source += "/" + below
		}
		fmt.Fprintf(&b, "from %s %s\n", enc([]byte(source)), enc([]byte(step.Path)))
	}
	return b.Bytes()
}

// Polled is one request of a poll's answer (EncodeRequests), as a client
// that is not a shell reads it: a restore Job (package restorejob).
type Polled struct {
	UID, Kind, Name string
	Paths           []string
	// Target is a restore's folder; InPlace, whether it may overwrite.
	Target  string
	InPlace bool
}

// DecodeRequests reads what EncodeRequests wrote. Lines of a request that
// it does not know are skipped, as the guest's script skips them, so that
// a server may say more of a request than an older client reads; a line
// outside a request is an error.
func DecodeRequests(data []byte) ([]Polled, error) {
	var (
		out []Polled
		cur *Polled
	)
	for n, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		word, rest, _ := strings.Cut(line, " ")
		if word != "request" && word != "end" && cur == nil {
			return nil, fmt.Errorf("requests line %d: %q outside a request", n+1, word)
		}
		var err error
		switch word {
		case "request":
			f := strings.Fields(rest)
			if len(f) != 3 {
				return nil, fmt.Errorf("requests line %d: a request line names a UID, a kind and a name", n+1)
			}
			cur = &Polled{UID: f[0], Kind: f[1], Name: f[2]}
		case "path":
			var p string
			p, err = decodeField(rest)
			cur.Paths = append(cur.Paths, p)
		case "target":
			cur.Target, err = decodeField(rest)
		case "in-place":
			cur.InPlace = true
		case "end":
			if cur == nil {
				return nil, fmt.Errorf("requests line %d: an end without a request", n+1)
			}
			out = append(out, *cur)
			cur = nil
		}
		if err != nil {
			return nil, fmt.Errorf("requests line %d: %w", n+1, err)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("request %s has no end: the answer was cut", cur.UID)
	}
	return out, nil
}

// Planned is one step of a restore's plan (EncodePlan), as a client that
// is not a shell reads it: Source, as `kopia restore` takes it, restores
// Path.
type Planned struct {
	Source, Path string
}

// DecodePlan reads what EncodePlan wrote.
func DecodePlan(data []byte) ([]Planned, error) {
	var out []Planned
	for n, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "from" {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("plan line %d: a from line names a source and a path", n+1)
		}
		source, err := decodeField(f[1])
		if err != nil {
			return nil, fmt.Errorf("plan line %d: %w", n+1, err)
		}
		p, err := decodeField(f[2])
		if err != nil {
			return nil, fmt.Errorf("plan line %d: %w", n+1, err)
		}
		out = append(out, Planned{Source: source, Path: p})
	}
	return out, nil
}

// decodeField decodes one base64 field of EncodeRequests or EncodePlan.
func decodeField(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("a field is not base64: %w", err)
	}
	return string(b), nil
}
