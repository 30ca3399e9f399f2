// Package clientserver is the server pod's client port: it hands the kopia
// client of its own image to guests that have none of its build, and takes
// their reports when they cannot run one (the contract is package
// clientdist's).
//
// Downloads need no credentials. The binary is public software, the same
// for every guest; its integrity comes from the SHA-256 the guest's
// bootstrap carries, not from who asks, and the only thing an anonymous
// download tells is the kopia version, which the Kopia server's own TLS
// endpoint already lets anyone who can reach it probe. Asking for the
// guest's password instead would cost a password hash (scrypt: 134 ms and
// 64 MiB) per download, at the worst moment: when a thousand VMs boot at
// once and each logs in to Kopia too. Who may reach the port at all is the
// server port's NetworkPolicy, and a bound on concurrent downloads keeps a
// stampede (or a hostile guest) from exhausting the pod: the rest are told
// to come back (503, Retry-After), which the guest's fetch does. That bound
// must not become the attack itself: a download that falls below a minimum
// average rate is cut and frees its slot at once, so a client that stops
// reading holds one for seconds, not for ever; and one source address may
// hold only a few slots, so a single host cannot take them all even for
// those seconds.
//
// Reports do need them: a report becomes a Warning Event on a VM, so an
// anonymous one would let anyone who reaches the port raise false alarms on
// any VM. A report is authenticated as the guest's Kopia user, against the
// password hash the server pod syncs into the repository, one hash at a
// time, and only a guest that cannot run kopia ever sends one.
package clientserver

import (
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/go-logr/logr"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Authenticator checks a guest's Kopia credentials.
type Authenticator interface {
	// Authenticate reports whether password is user's current one.
	Authenticate(user, password string) bool
}

// Reporter takes a guest's authenticated report.
type Reporter interface {
	Report(user string, r activity.Report)
}

// Requests are the requests guests carry out (package userset's
// Request), and where they are with them.
type Requests interface {
	// Pending returns the requests addressed to user that it has yet to
	// finish, the guest's and its restore Jobs' (userset.Request.Job), in
	// a slice the caller owns.
	Pending(user string) ([]userset.Request, error)
	// Result records that user is in phase with its request uid, saying
	// message; ErrUnknownRequest when no such request is addressed to it,
	// ErrRequestEnded when phase is Running and the request has ended.
	// Repeating an ending changes nothing.
	Result(ctx context.Context, user, uid, phase, message string) error
	// Progress records that user's guest has restored the first restored
	// steps of the plan of its running restore uid; ErrUnknownRequest
	// when no such restore is addressed to it, ErrRequestEnded when it
	// has ended. Progress that does not move on changes nothing.
	Progress(ctx context.Context, user, uid string, restored int) error
	// Plan is what user's guest restores for its started request uid:
	// the snapshot of each path, chosen when it started; none for a
	// request of another kind.
	Plan(ctx context.Context, user, uid string) ([]clientdist.PlanStep, error)
	// Changed is closed when the requests that may be addressed to user
	// change: a held poll then looks again.
	Changed(user string) <-chan struct{}
}

// Options configure a Server.
type Options struct {
	// Binaries maps each architecture (clientdist.Archs) to the kopia
	// binary served for it.
	Binaries map[string]string
	// Authenticator and Reporter serve reports; without both, reports are
	// refused (501).
	Authenticator Authenticator
	Reporter      Reporter
	// Requests serves guests' requests and takes their results; without
	// it and Authenticator, both are refused (501).
	Requests Requests
	// MaxDownloads bounds concurrent downloads; default 8.
	MaxDownloads int
	// MaxDownloadsPerSource bounds concurrent downloads from one IP
	// address (a guest needs one at a time), so that one host cannot take
	// every slot; default 4: half of MaxDownloads's default, since guests
	// behind one address (a front that rewrites sources, SNAT) share it.
	MaxDownloadsPerSource int
	// MinRate is the average rate, in bytes per second since a download
	// started, below which it is cut once Grace has passed: a client that
	// reads too slowly, or not at all, must not keep its slot. Default
	// 128 KiB/s: the binary is some 60 MB, and guests under software
	// emulation are slow but read far faster than that.
	MinRate int64
	// Grace is the head start a download has over MinRate (TLS handshake,
	// TCP slow start, a guest busy booting); default 15 s.
	Grace time.Duration
	// MaxHeld bounds the polls held at once (clientdist.WaitParam), each
	// a connection and a goroutine of the pod; beyond, a poll is answered
	// at once. Default 20,000: two per guest at 10,000 guests.
	MaxHeld int
	// MaxHeldPerUser bounds one user's held polls, so that a guest that
	// opens many cannot take the others' room; default 2 (a guest polls
	// once at a time, and its previous poll may linger a moment).
	MaxHeldPerUser int
	// Done ends every held poll, answered with what is pending: the pod
	// stops, and its server's shutdown waits for no hold. nil: never.
	Done <-chan struct{}
	// Clock stamps reports; nil: the real clock.
	Clock clock.PassiveClock
	Log   logr.Logger
}

// Server serves the client binaries and takes reports.
type Server struct {
	opts      Options
	binaries  map[string]*binary
	status    v1alpha1.ClientStatus
	downloads chan struct{}
	// mu guards sources, the downloads in flight per source address, and
	// the held polls.
	mu      sync.Mutex
	sources map[string]int
	// logins allows one password check at a time. A check may cost a hash
	// (64 MiB for scrypt) in the verifier whose slots the session gate's
	// logins wait for, and this port limits no address: one slot is all
	// that reports with wrong passwords can take from guests' logins. A
	// returning guest's check costs no hash, so the slot passes quickly.
	logins chan struct{}
	// held counts the polls held, in all and per user (guarded by mu).
	held        int
	heldPerUser map[string]int
}

type binary struct {
	file    *os.File
	size    int64
	modTime time.Time
}

// Open opens and hashes the binaries; Close releases them. What it hashed is
// what it serves: the open files, never the paths again.
func Open(o Options) (*Server, error) {
	if len(o.Binaries) == 0 {
		return nil, errors.New("no client binary to serve")
	}
	if o.MaxDownloads <= 0 {
		o.MaxDownloads = 8
	}
	if o.MaxDownloadsPerSource <= 0 {
		o.MaxDownloadsPerSource = 4
	}
	if o.MinRate <= 0 {
		o.MinRate = 128 << 10
	}
	if o.Grace <= 0 {
		o.Grace = 15 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.MaxHeld <= 0 {
		o.MaxHeld = 20_000
	}
	if o.MaxHeldPerUser <= 0 {
		o.MaxHeldPerUser = 2
	}
	s := &Server{
		opts: o, binaries: map[string]*binary{},
		status:      v1alpha1.ClientStatus{SHA256: map[string]string{}},
		downloads:   make(chan struct{}, o.MaxDownloads),
		sources:     map[string]int{},
		logins:      make(chan struct{}, 1),
		heldPerUser: map[string]int{},
	}
	for _, arch := range slices.Sorted(maps.Keys(o.Binaries)) {
		b, sum, version, err := openBinary(o.Binaries[arch])
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("client for %s: %w", arch, err)
		}
		s.binaries[arch] = b
		s.status.SHA256[arch] = sum
		if s.status.Version == "" {
			s.status.Version = version
		} else if version != s.status.Version {
			s.Close()
			return nil, fmt.Errorf("client for %s is kopia %s, another is %s: every architecture must get the same version", arch, version, s.status.Version)
		}
	}
	if err := clientdist.Validate(&s.status); err != nil {
		s.Close()
		return nil, fmt.Errorf("clients: %w", err)
	}
	return s, nil
}

func openBinary(path string) (*binary, string, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", "", err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, "", "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		f.Close()
		return nil, "", "", fmt.Errorf("hash %s: %w", path, err)
	}
	// The version from the binary's Go build information, read without
	// running it (an arm64 binary cannot run here).
	version := ""
	if bi, err := buildinfo.ReadFile(path); err == nil {
		for _, m := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
			if m.Path == "github.com/kopia/kopia" {
				version = m.Version
			}
		}
	}
	return &binary{file: f, size: fi.Size(), modTime: fi.ModTime()}, hex.EncodeToString(h.Sum(nil)), version, nil
}

// Status is what the server serves, for the BSLS's status (without URL:
// the controller knows the endpoint).
func (s *Server) Status() v1alpha1.ClientStatus {
	st := s.status
	st.SHA256 = maps.Clone(s.status.SHA256)
	return st
}

// Close releases the binaries.
func (s *Server) Close() {
	for _, b := range s.binaries {
		b.file.Close()
	}
}

// Handler serves clientdist.DownloadPath of each architecture and
// clientdist.ReportPath.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for arch, b := range s.binaries {
		mux.HandleFunc("GET "+clientdist.DownloadPath(arch), func(w http.ResponseWriter, r *http.Request) {
			s.download(w, r, arch, b)
		})
	}
	mux.HandleFunc("POST "+clientdist.ReportPath, s.report)
	mux.HandleFunc("GET "+clientdist.RequestsPath, s.requests)
	mux.HandleFunc("POST "+clientdist.ResultPath, s.result)
	return mux
}

func (s *Server) download(w http.ResponseWriter, r *http.Request, arch string, b *binary) {
	source := sourceOf(r)
	release, busy := s.acquire(source)
	if busy != "" {
		w.Header().Set("Retry-After", "5")
		http.Error(w, busy, http.StatusServiceUnavailable)
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-SHA256", s.status.SHA256[arch])
	pw := &pacedWriter{ResponseWriter: w, rc: http.NewResponseController(w), start: time.Now(), grace: s.opts.Grace, rate: s.opts.MinRate}
	http.ServeContent(pw, r, "kopia", b.modTime, io.NewSectionReader(b.file, 0, b.size))
	pw.finish()
	if pw.slow {
		s.opts.Log.V(1).Info("download cut: the client read too slowly", "remote", r.RemoteAddr, "arch", arch,
			"bytes", pw.written, "elapsed", time.Since(pw.start).Round(time.Millisecond).String())
	}
}

// acquire takes a download slot for source, within both the global and the
// per-source bound. It returns the slot's release, or why there is none.
func (s *Server) acquire(source string) (release func(), busy string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sources[source] >= s.opts.MaxDownloadsPerSource {
		return nil, fmt.Sprintf("too many downloads from %s at once; try again shortly", source)
	}
	select {
	case s.downloads <- struct{}{}:
	default:
		return nil, "too many downloads at once; try again shortly"
	}
	s.sources[source]++
	return func() {
		<-s.downloads
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.sources[source]--; s.sources[source] <= 0 {
			delete(s.sources, source)
		}
	}, ""
}

// sourceOf is the IP address r comes from (an IPv4 address mapped into
// IPv6 counts as itself), or its whole RemoteAddr when that has no port.
func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().WithZone("").String()
	}
	return host
}

// writeFloor is the least time any write is given: a deadline a few
// milliseconds away would cut a client for a scheduling hiccup rather than
// for its rate.
const writeFloor = 5 * time.Second

// errTooSlow ends a download whose average rate has already fallen below
// the minimum.
var errTooSlow = errors.New("the client reads below the minimum rate")

// pacedWriter is the ResponseWriter of one download. Before each write it
// sets the connection's write deadline to when the bytes written so far,
// this write's included, must have been taken for the download to keep
// rate on average since start, after grace (never less than writeFloor
// from now); a write the client does not take by then fails, the handler
// returns, and the slot is free. A write that finds the average already
// below rate fails at once. The server sets no WriteTimeout, which would
// cut honest slow downloads as well.
//
// It deliberately implements nothing but Write (not io.ReaderFrom), so
// that every chunk of the copy passes here.
type pacedWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	start    time.Time
	grace    time.Duration
	rate     int64
	written  int64
	deadline time.Time
	// failed: a write failed; slow: it failed for the client's rate.
	failed, slow bool
}

// due is when n bytes must have been taken to keep the minimum rate.
func (p *pacedWriter) due(n int64) time.Time {
	// Whole seconds and remainder apart: n*time.Second would overflow for
	// files above 9 GB.
	return p.start.Add(p.grace + time.Duration(n/p.rate)*time.Second + time.Duration(n%p.rate)*time.Second/time.Duration(p.rate))
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Write writes b by its deadline.
func (p *pacedWriter) Write(b []byte) (int, error) {
	now := time.Now()
	// A client already behind the minimum average gets no fresh floor:
	// otherwise one that takes a chunk every writeFloor would keep its
	// slot at a trickle.
	if now.After(p.due(p.written)) {
		p.failed, p.slow = true, true
		// What is buffered must not wait for it either.
		_ = p.rc.SetWriteDeadline(now)
		return 0, errTooSlow
	}
	p.deadline = later(p.due(p.written+int64(len(b))), now.Add(writeFloor))
	if err := p.rc.SetWriteDeadline(p.deadline); err != nil {
		p.failed = true
		return 0, fmt.Errorf("set the download's write deadline: %w", err)
	}
	n, err := p.ResponseWriter.Write(b)
	p.written += int64(n)
	if err != nil {
		p.failed = true
		p.slow = !time.Now().Before(p.deadline)
	}
	return n, err
}

// finish flushes what the response still buffers under the same pace, then
// lifts the deadline, which would otherwise outlive the download on a
// kept-alive connection.
func (p *pacedWriter) finish() {
	if p.failed {
		return
	}
	now := time.Now()
	p.deadline = later(p.due(p.written), now.Add(writeFloor))
	if err := p.rc.SetWriteDeadline(p.deadline); err != nil {
		return
	}
	if err := p.rc.Flush(); err != nil {
		p.slow = !time.Now().Before(p.deadline)
		return
	}
	_ = p.rc.SetWriteDeadline(time.Time{})
}

func (s *Server) report(w http.ResponseWriter, r *http.Request) {
	if s.opts.Authenticator == nil || s.opts.Reporter == nil {
		http.Error(w, "this server takes no reports", http.StatusNotImplemented)
		return
	}
	kind := r.URL.Query().Get(clientdist.KindParam)
	if !slices.Contains(clientdist.ReportKinds, kind) {
		http.Error(w, fmt.Sprintf("kind %q is none of %v", kind, clientdist.ReportKinds), http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 4*clientdist.MaxReportMessage))
	if err != nil {
		http.Error(w, "cannot read the report", http.StatusBadRequest)
		return
	}
	user, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	rep := activity.Report{Kind: kind, Message: Sanitize(string(body)), At: s.opts.Clock.Now().UTC().Truncate(time.Second)}
	s.opts.Reporter.Report(user, rep)
	s.opts.Log.Info("guest reported a client problem", "user", user, "kind", kind, "message", rep.Message)
	w.WriteHeader(http.StatusNoContent)
}

// authenticate returns the Kopia user r's basic credentials authenticate,
// checked one at a time (Server.logins); without, it has answered r.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	user, password, ok := r.BasicAuth()
	if !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="guestbackup"`)
		http.Error(w, "credentials required", http.StatusUnauthorized)
		return "", false
	}
	select {
	case s.logins <- struct{}{}:
	case <-r.Context().Done():
		return "", false
	}
	valid := s.opts.Authenticator.Authenticate(user, password)
	<-s.logins
	if !valid {
		w.Header().Set("WWW-Authenticate", `Basic realm="guestbackup"`)
		http.Error(w, "access denied", http.StatusUnauthorized)
		return "", false
	}
	return user, true
}

// requests answers a guest's poll with the requests addressed to its own
// identity, and only those. A returning guest's check costs no hash
// (Authenticator verifies from memory), so polls from many guests cost
// the pod little. A poll that asks to wait (clientdist.WaitParam) and
// finds nothing pending is held until a request is addressed to its guest,
// its wait ends, or the pod stops: one TLS handshake per hold, not per
// interval, and a request starts within seconds.
func (s *Server) requests(w http.ResponseWriter, r *http.Request) {
	if s.opts.Authenticator == nil || s.opts.Requests == nil {
		http.Error(w, "this server carries no requests", http.StatusNotImplemented)
		return
	}
	wait, err := pollWait(r.URL.Query().Get(clientdist.WaitParam))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	uid := r.URL.Query().Get(clientdist.UIDParam)
	user, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	var timeout <-chan time.Time
	for {
		// Taken before Pending reads: a change between the two is not
		// missed.
		changed := s.opts.Requests.Changed(user)
		pending, err := s.opts.Requests.Pending(user)
		if err != nil {
			s.opts.Log.Error(err, "cannot list a guest's requests", "user", user)
			w.Header().Set("Retry-After", "30")
			http.Error(w, "the requests cannot be read now; try again shortly", http.StatusServiceUnavailable)
			return
		}
		pending = addressed(pending, uid)
		if len(pending) > 0 || wait == 0 {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write(clientdist.EncodeRequests(pending))
			return
		}
		if timeout == nil {
			release, held := s.hold(user)
			if !held {
				wait = 0 // answered at once, as a poll that asked no wait
				continue
			}
			defer release()
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-changed:
		case <-timeout:
			wait = 0
		case <-s.opts.Done:
			wait = 0
		case <-r.Context().Done():
			return
		}
	}
}

// addressed are those of pending that a poll naming uid is answered
// with: a guest's poll names none, and is answered with the requests its
// guest carries out; a restore Job's names its request's UID, and is
// answered with that request alone, if it is a Job's (userset.Request.Job).
// So neither takes the other's: the guest never writes into a claim it
// has not mounted, and a Job carries out nothing in the guest.
func addressed(pending []userset.Request, uid string) []userset.Request {
	return slices.DeleteFunc(pending, func(r userset.Request) bool {
		if uid == "" {
			return r.Job
		}
		return !r.Job || r.UID != uid
	})
}

// pollWait is how long a poll asks to be held: v seconds, at most
// clientdist.MaxPollWait; 0 for none.
func pollWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q is not a number of seconds", clientdist.WaitParam, v)
	}
	return time.Duration(min(n, int(clientdist.MaxPollWait/time.Second))) * time.Second, nil
}

// hold takes a slot for user's held poll; false when the pod holds as
// many polls as it may, in all or of that user.
func (s *Server) hold(user string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held >= s.opts.MaxHeld || s.heldPerUser[user] >= s.opts.MaxHeldPerUser {
		return nil, false
	}
	s.held++
	s.heldPerUser[user]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.held--
		if s.heldPerUser[user]--; s.heldPerUser[user] == 0 {
			delete(s.heldPerUser, user)
		}
	}, true
}

// result takes where a guest is with one of its own requests.
func (s *Server) result(w http.ResponseWriter, r *http.Request) {
	if s.opts.Authenticator == nil || s.opts.Requests == nil {
		http.Error(w, "this server carries no requests", http.StatusNotImplemented)
		return
	}
	q := r.URL.Query()
	uid, phase := q.Get(clientdist.UIDParam), q.Get(clientdist.PhaseParam)
	if !slices.Contains(resultPhases, phase) {
		http.Error(w, fmt.Sprintf("phase %q is none of %v", phase, resultPhases), http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 4*clientdist.MaxReportMessage))
	if err != nil {
		http.Error(w, "cannot read the result", http.StatusBadRequest)
		return
	}
	restored, progress, err := restoredParam(q, phase)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	user, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	if progress {
		s.progress(w, r, user, uid, restored)
		return
	}
	if s.refused(w, s.opts.Requests.Result(r.Context(), user, uid, phase, Sanitize(string(body))), user, uid, "result") {
		return
	}
	s.opts.Log.Info("guest answered a request", "user", user, "uid", uid, "phase", phase)
	if phase == string(v1alpha1.PhaseRunning) {
		s.plan(w, r, user, uid)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refused answers a guest whose result (what: its ending or start, or its
// progress) could not be recorded, saying why; false when err is nil and
// nothing was answered.
func (s *Server) refused(w http.ResponseWriter, err error, user, uid, what string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrUnknownRequest):
		// The same answer whether the request does not exist or is
		// another guest's: a guest learns nothing of others' requests.
		http.Error(w, fmt.Sprintf("no request %q is addressed to %s", uid, user), http.StatusNotFound)
	case errors.Is(err, ErrRequestEnded):
		// A poll that reached a replica which had not heard of the
		// ending, or a restore that cannot be carried out: the guest's
		// Running answer fails, and it carries nothing out.
		http.Error(w, fmt.Sprintf("request %q: %v", uid, err), http.StatusConflict)
	default:
		s.opts.Log.Error(err, "cannot record a guest's "+what, "user", user, "uid", uid)
		w.Header().Set("Retry-After", "10")
		http.Error(w, "the "+what+" cannot be recorded now; try again shortly", http.StatusServiceUnavailable)
	}
	return true
}

// restoredParam reads a result's progress (clientdist.RestoredParam):
// progress is false when it carries none.
func restoredParam(q url.Values, phase string) (restored int, progress bool, err error) {
	if !q.Has(clientdist.RestoredParam) {
		return 0, false, nil
	}
	if phase != string(v1alpha1.PhaseRunning) {
		return 0, false, fmt.Errorf("%s goes with phase %s only", clientdist.RestoredParam, v1alpha1.PhaseRunning)
	}
	n, err := strconv.Atoi(q.Get(clientdist.RestoredParam))
	if err != nil || n < 1 || n > userset.MaxRequestPaths {
		return 0, false, fmt.Errorf("%s=%q is not a count of restored paths from 1 to %d", clientdist.RestoredParam, q.Get(clientdist.RestoredParam), userset.MaxRequestPaths)
	}
	return n, true, nil
}

// progress records how far a guest's restore got.
func (s *Server) progress(w http.ResponseWriter, r *http.Request, user, uid string, restored int) {
	if !s.refused(w, s.opts.Requests.Progress(r.Context(), user, uid, restored), user, uid, "progress") {
		w.WriteHeader(http.StatusNoContent)
	}
}

// plan answers a guest's Running with what it is to restore, if its
// request is a restore (clientdist.EncodePlan); with nothing otherwise.
func (s *Server) plan(w http.ResponseWriter, r *http.Request, user, uid string) {
	plan, err := s.opts.Requests.Plan(r.Context(), user, uid)
	if err != nil {
		s.opts.Log.Error(err, "cannot read a restore's plan", "user", user, "uid", uid)
		w.Header().Set("Retry-After", "10")
		http.Error(w, "the restore's plan cannot be read now; try again shortly", http.StatusServiceUnavailable)
		return
	}
	if len(plan) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write(clientdist.EncodePlan(plan))
}

// resultPhases are the phases a guest may report.
var resultPhases = []string{string(v1alpha1.PhaseRunning), string(v1alpha1.PhaseSucceeded), string(v1alpha1.PhaseFailed)}

// ErrUnknownRequest is Requests.Result's error for a UID that is not one
// of the user's pending requests.
var ErrUnknownRequest = errors.New("no such request for this user")

// ErrRequestEnded is Requests.Result's error for a Running answer to a
// request whose ending is recorded already.
var ErrRequestEnded = errors.New("the request has ended already")

// Sanitize makes a guest's words fit for an Event: one line of printable
// characters, at most clientdist.MaxReportMessage bytes.
func Sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\t' || r == '\r':
			return ' '
		case !unicode.IsPrint(r):
			return -1
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > clientdist.MaxReportMessage {
		s = strings.ToValidUTF8(s[:clientdist.MaxReportMessage], "")
	}
	return s
}

// readHeaderTimeout bounds a request's headers (a slow client holds no
// connection open for free).
const readHeaderTimeout = 10 * time.Second

// idleTimeout closes a kept-alive connection that asks nothing more, so
// that idle ones do not hold the pod's file descriptors for ever. There is
// deliberately no WriteTimeout: it would cut honest slow downloads; each
// download paces its own writes instead (Options.MinRate).
const idleTimeout = 60 * time.Second

// ListenAndServe serves h over TLS on addr with the certificate chain and
// key the Kopia server presents, until ctx ends.
func ListenAndServe(ctx context.Context, addr, chainFile, keyFile string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("client port: %w", err)
	}
	return Serve(ctx, ln, chainFile, keyFile, h)
}

// Serve is ListenAndServe on a listener of the caller's; it closes it.
func Serve(ctx context.Context, ln net.Listener, chainFile, keyFile string, h http.Handler) error {
	if err := serverpod.ServeTLS(ctx, ln, chainFile, keyFile, &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout}); err != nil {
		return fmt.Errorf("client port: %w", err)
	}
	return nil
}

// Publish writes st under clientdist.Key into the BSLS's state ConfigMap,
// keeping its other keys (maintenancestate.SetKey).
func Publish(ctx context.Context, configMaps typedcorev1.ConfigMapInterface, bsls string, st v1alpha1.ClientStatus) error {
	data := clientdist.Encode(st)
	return maintenancestate.SetKey(ctx, configMaps, bsls, clientdist.Key, func(string) string { return data })
}
