// Package sessiongate is the port guests' Kopia clients connect to in a
// server pod: it ends their TLS with the server's own certificate and
// forwards each request to the Kopia server on the pod's loopback, keeping,
// for each Kopia user, the gRPC sessions it holds open.
//
// It exists because Kopia's server authorizes a gRPC session once, when it
// opens (internal/server/grpc_session.go of Kopia v0.23.1: Authorize before
// the session's request loop), and offers no way to end one user's
// sessions: a session opened under access that user sync then revokes (a
// restore grant removed, a user deleted, a password changed) would keep
// that access for as long as its client holds it. User sync calls End for
// the users whose access it narrowed, after the server has reloaded the
// repository, so that their clients reconnect, and are authenticated and
// authorized again, under the access in force. Other users' sessions are
// not touched.
//
// Each guest connection gets its own connection to the Kopia server, so
// that HTTP/2 flow control between guests stays what it is without the
// gate: one guest's stalled session never holds up another's.
//
// Anyone who reaches the port can make the pod verify a password, so the
// gate also decides which logins go on (logins.go): a few at once (one per
// core), only those someone still waits for, and few from any one
// address, fewer still after one failed. It bounds the connections of an
// address, and closes idle ones. The directory verifies an admitted
// login's password itself where it can, and names the credential Kopia
// gets in its place (package logins): Kopia's own verification holds one
// mutex around the hash for every guest of the pod.
//
// Kopia's server lets a user write whatever its ACL allows, and ignores
// the read_only flag a session declares. A VM over its backup quota must
// still list, read and restore its snapshots, and may only stop adding to
// the repository, so the gate decides each request of a session
// (writes.go): while Options.Writes refuses a user's writes, its requests
// are inspected as Kopia's server would read them (at most 64 KiB of each
// held), and each write_content or put_manifest is answered by the gate
// itself with an error saying why (its kopia command fails with it) and
// never reaches Kopia; reads, flushes and deletions pass, and the session
// goes on, writing again as soon as the user is no longer refused. The
// messages of a user it does not refuse go by as they are read.
package sessiongate

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Timeouts of the gate's connections to the Kopia server on loopback.
const (
	dialTimeout = 10 * time.Second
	// idleTimeout closes a connection to the Kopia server its guest no
	// longer uses.
	idleTimeout = 30 * time.Second
	// readHeaderTimeout bounds a guest's request headers (and its TLS
	// handshake).
	readHeaderTimeout = 15 * time.Second
	// firstMessageTimeout bounds how long a session may take to send its
	// first message, before it is admitted; maxFirstMessage bounds the
	// message (Kopia's first is its session's parameters, a few hundred
	// bytes).
	firstMessageTimeout = 10 * time.Second
	maxFirstMessage     = 64 << 10
	// defaultIdleTimeout is Options.IdleTimeout's default: an idle
	// connection holds a file descriptor and an upstream transport.
	defaultIdleTimeout = 2 * time.Minute
	// upstreamStreamBuffer and upstreamConnectionBuffer bound what the
	// gate holds of Kopia's answers a guest has not read yet, per stream
	// and per guest connection (a guest that reads keeps them draining).
	upstreamStreamBuffer     = 1 << 20
	upstreamConnectionBuffer = 4 << 20
)

// gRPC status codes the gate answers with (google.golang.org/grpc/codes).
const (
	grpcInvalidArgument   = 3
	grpcResourceExhausted = 8
	grpcPermissionDenied  = 7
	grpcUnavailable       = 14
)

// ErrSessionEnded is the cause of a session End ended.
var ErrSessionEnded = errors.New("session ended by guestbackup: its access was revoked")

// OpenSessions is the number of Kopia sessions guests hold open through
// the gate (guestbackup_server_sessions, on the user-sync container's
// /metrics).
var OpenSessions = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "guestbackup_server_sessions",
	Help: "Kopia sessions guests hold open with this server pod.",
})

// SessionsStarted counts the Kopia sessions guests opened through the gate
// (guestbackup_server_sessions_started_total): each is one login the
// directory admitted, whose password the Kopia server or the directory
// verified, so its rate is the pod's login rate.
var SessionsStarted = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "guestbackup_server_sessions_started_total",
	Help: "Kopia sessions guests opened with this server pod: each one a login, its password verified by a hash or from memory (guestbackup_server_password_verifications_total).",
})

// Collectors are the gate's metrics, for the user-sync container's
// /metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{OpenSessions, SessionsStarted, LoginsThrottled}
}

// Options configure a Gate.
type Options struct {
	// Upstream is the Kopia server on the pod's loopback
	// (https://127.0.0.1:<port>).
	Upstream string
	// TLS is how the gate trusts it (serverpod.TrustChain).
	TLS *tls.Config
	// LoginsInFlight, LoginsPerSource and ConnectionsPerSource bound what
	// guests may cost the server; zero: DefaultLoginsInFlight or
	// GOMAXPROCS, whichever is more, DefaultLoginsPerSource,
	// DefaultConnectionsPerSource.
	LoginsInFlight       int
	LoginsPerSource      int
	ConnectionsPerSource int
	// IdleTimeout closes a guest's connection that has had no stream for
	// that long; zero: 2 minutes. A guest's kopia keeps a stream open for
	// as long as a command runs, and reconnects for the next.
	IdleTimeout time.Duration
	// Directory, when set, decides which users may open a session before
	// the Kopia server is asked (usersync.Syncer).
	Directory Directory
	// Writes, when set, says whose sessions may not write now
	// (usersync.Syncer: a VM over its backup quota); nil: nobody is
	// refused.
	Writes WriteGuard
	// Clock times the backoff after failed logins; nil: the real clock.
	Clock clock.WithDelayedExecution
	Log   logr.Logger
}

// Directory says who may open a session, by the users the BSLS lists now.
// The Kopia server knows only the users user sync has written into the
// repository, and a full or failing storage holds that write back: there,
// a user removed from the BSLS, or the old password of a rotated one,
// would still open sessions, for as long as the storage refuses writes.
type Directory interface {
	// Admits returns the password to hand the Kopia server when user
	// (user@host) may open a session with password, else why not. It may
	// verify the password (one hash, on any free core), so the gate asks
	// only for a login the login limiter admitted, and gives up with ctx.
	// The password it returns is password itself, for the server to
	// verify, or a credential of the pod's own that the server checks
	// without a slow hash, for a password it verified.
	Admits(ctx context.Context, user, password string) (string, error)
}

// Gate forwards guests' requests to the Kopia server and can end the
// sessions of chosen users. Its zero value is not usable: see New.
type Gate struct {
	upstream *url.URL
	tls      *tls.Config
	log      logr.Logger
	proxy    *httputil.ReverseProxy
	logins   *loginLimiter
	conns    *connections
	// directory is Options.Directory.
	directory Directory
	// writes is Options.Writes.
	writes WriteGuard
	// idleTimeout is Options.IdleTimeout.
	idleTimeout time.Duration

	mu sync.Mutex
	// sessions are the open sessions of each Kopia user (user@host).
	sessions map[string]map[*session]struct{}
	// upstreams are the transports of the guests' connections.
	upstreams map[net.Conn]*http.Transport
	// counted are the guests' connections within their address's bound,
	// by address.
	counted map[net.Conn]string
}

// session is one gRPC session a guest holds open.
type session struct {
	end context.CancelCauseFunc
}

type connKey struct{}

// loginKey carries a login's *loginTicket to the transport, which sees
// the Kopia server's answer.
type loginKey struct{}

// loginTicket is an admitted login: its report function
// (loginLimiter.admit), and whether it reached the Kopia server.
type loginTicket struct {
	done      func(loginResult)
	forwarded atomic.Bool
}

// New returns a gate in front of the Kopia server o.Upstream.
func New(o Options) (*Gate, error) {
	u, err := url.Parse(o.Upstream)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("the Kopia server must be an https:// URL, got " + strconv.Quote(o.Upstream))
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.LoginsInFlight <= 0 {
		// A directory that verifies passwords itself does so on every
		// core.
		o.LoginsInFlight = max(DefaultLoginsInFlight, runtime.GOMAXPROCS(0))
	}
	if o.LoginsPerSource <= 0 {
		o.LoginsPerSource = DefaultLoginsPerSource
	}
	if o.ConnectionsPerSource <= 0 {
		o.ConnectionsPerSource = DefaultConnectionsPerSource
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = defaultIdleTimeout
	}
	g := &Gate{
		upstream: u, tls: o.TLS, log: o.Log,
		logins:      newLoginLimiter(o.Clock, o.LoginsInFlight, o.LoginsPerSource),
		conns:       &connections{max: o.ConnectionsPerSource, of: map[string]int{}},
		sessions:    map[string]map[*session]struct{}{},
		upstreams:   map[net.Conn]*http.Transport{},
		counted:     map[net.Conn]string{},
		idleTimeout: o.IdleTimeout,
		directory:   o.Directory,
		writes:      o.Writes,
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(g.upstream) },
		Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			t, ok := r.Context().Value(connKey{}).(*http.Transport)
			if !ok {
				return nil, errors.New("request of no guest connection")
			}
			login, _ := r.Context().Value(loginKey{}).(*loginTicket)
			if login != nil {
				login.forwarded.Store(true)
			}
			res, err := roundTrip(t, r)
			if err == nil && isGRPC(r) {
				res.Body = &endedBody{ReadCloser: res.Body, ctx: r.Context()}
			}
			if login != nil {
				done := login.done
				switch {
				case err != nil && r.Context().Err() != nil:
					done(loginAbandoned)
				case err != nil:
					done(loginUnknown)
				case isGRPC(r):
					// Kopia sends nothing before it has verified the
					// password, then either the session's first message
					// or, at once, the end of the stream and a status.
					res.Body = &sessionAnswer{ReadCloser: res.Body, res: res, done: done}
				default:
					done(resultOf(res))
				}
			}
			return res, err
		}),
		// gRPC streams both ways: every message is passed on at once.
		FlushInterval: -1,
		ErrorHandler:  g.proxyError,
		// What the proxy notes on its own is a guest that went away
		// mid-stream: routine, so only at verbosity 1.
		ErrorLog: log.New(logWriter{g.log.V(1)}, "", 0),
	}
	return g, nil
}

// logWriter writes a log.Logger's lines to a logr.Logger.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// errResponseEnded ends the copy of a guest's stream to the Kopia server
// once the server's answer to it has ended.
var errResponseEnded = errors.New("the Kopia server ended its response")

// roundTrip sends r through t, its body through a pipe that closes when
// the response does. A gRPC server may answer before the client has sent
// all it will (Kopia refuses a session before reading it), and net/http's
// HTTP/2 transport, on closing such a response, waits for the request body
// to end: the guest's, which ReverseProxy never lets it close, and which
// the guest keeps open while it waits for that very answer.
func roundTrip(t http.RoundTripper, r *http.Request) (*http.Response, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return t.RoundTrip(r)
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := io.Copy(pw, r.Body)
		pw.CloseWithError(err)
	}()
	out := r.Clone(r.Context())
	out.Body = recordSized{pr}
	res, err := t.RoundTrip(out)
	if err != nil {
		pr.CloseWithError(err)
		return nil, err
	}
	res.Body = &afterClose{ReadCloser: res.Body, then: func() { pr.CloseWithError(errResponseEnded) }}
	return res, nil
}

// maxRecordData is the most a DATA frame to the Kopia server may carry for
// the frame, with its 9-byte header, to fit one TLS record (16 KiB of
// plaintext).
const maxRecordData = 16<<10 - 9

// recordSized is a request body read at most maxRecordData bytes at a
// time. Go's HTTP/2 transport sends what each read returns as DATA frames
// of up to the server's largest (16 KiB for Kopia's gRPC server) and
// writes each out at once: a full 16 KiB frame takes two TLS records, and
// two writes to the socket, of which the second carries 9 bytes. Reads
// one frame header short of that take half the records and writes, on the
// gate's side and on Kopia's.
type recordSized struct{ io.ReadCloser }

func (r recordSized) Read(p []byte) (int, error) {
	if len(p) > maxRecordData {
		p = p[:maxRecordData]
	}
	return r.ReadCloser.Read(p)
}

// afterClose is a response body that, once closed, also ends its request's.
type afterClose struct {
	io.ReadCloser
	then func()
}

func (b *afterClose) Close() error {
	b.then()
	return b.ReadCloser.Close()
}

// Server is the HTTP server of the gate's port: it gives each guest
// connection its own connection to the Kopia server, and closes it with
// the guest's. Serve it with TLS (serverpod.ServeTLS).
func (g *Gate) Server() *http.Server {
	return &http.Server{
		Handler:           g,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       g.idleTimeout,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			t := g.transport()
			g.mu.Lock()
			g.upstreams[c] = t
			g.mu.Unlock()
			return context.WithValue(ctx, connKey{}, t)
		},
		ConnState: func(c net.Conn, state http.ConnState) {
			switch state {
			case http.StateNew:
				source := sourceOf(c.RemoteAddr().String())
				if !g.conns.open(source) {
					g.log.V(1).Info("connection refused: its address holds too many", "source", source)
					c.Close()
					return
				}
				g.mu.Lock()
				g.counted[c] = source
				g.mu.Unlock()
				return
			case http.StateClosed, http.StateHijacked:
			default:
				return
			}
			g.mu.Lock()
			t := g.upstreams[c]
			delete(g.upstreams, c)
			source, counted := g.counted[c]
			delete(g.counted, c)
			g.mu.Unlock()
			if counted {
				g.conns.close(source)
			}
			if t != nil {
				t.CloseIdleConnections()
			}
		},
	}
}

// transport is a guest connection's way to the Kopia server: HTTP/2 over
// TLS, on connections of its own.
func (g *Gate) transport() *http.Transport {
	protocols := new(http.Protocols)
	protocols.SetHTTP2(true)
	return &http.Transport{
		TLSClientConfig: g.tls.Clone(),
		Protocols:       protocols,
		// What Kopia answers and the guest has not read waits here: Go's
		// defaults (4 MiB a stream, 1 GiB a connection) let a guest that
		// opens many streams and reads none hold the pod's memory.
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerStream:     upstreamStreamBuffer,
			MaxReceiveBufferPerConnection: upstreamConnectionBuffer,
		},
		DialContext:         (&net.Dialer{Timeout: dialTimeout}).DialContext,
		TLSHandshakeTimeout: dialTimeout,
		IdleConnTimeout:     idleTimeout,
	}
}

// ServeHTTP forwards r to the Kopia server. A gRPC request is a session
// (Kopia's one method, KopiaRepository.Session): it is kept, under the
// user its metadata names, until it ends or End ends it. Any other request
// (Kopia's /metrics, its control API) is passed on as it is, untracked:
// Kopia checks each such request's credentials on its own.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !isGRPC(r) {
		if isLogin(r) {
			var finish func()
			var ok bool
			if r, finish, ok = g.admitLogin(w, r); !ok {
				return
			}
			defer finish()
		}
		g.proxy.ServeHTTP(w, r)
		return
	}
	if r.ProtoMajor != 2 {
		// gRPC needs HTTP/2, and Kopia refuses a session that is not.
		// Passed on, this one would reach Kopia over the gate's own
		// HTTP/2 connection as a session the gate never kept, which no
		// revocation could end.
		http.Error(w, "a Kopia session needs HTTP/2", http.StatusHTTPVersionNotSupported)
		return
	}
	user, password, ok := sessionCredentials(r.Header)
	if !ok {
		// Kopia refuses it as well ("missing credentials"); nothing to keep.
		writeGRPCError(w, grpcPermissionDenied, "missing credentials")
		return
	}
	// Kopia answers a session it accepts only once the client's first
	// message is in: holding it back would hold the login's place there.
	if r, ok = g.withFirstMessage(w, r); !ok {
		return
	}
	r, finish, ok := g.admitLogin(w, r)
	if !ok {
		return
	}
	defer finish()
	ctx, end := context.WithCancelCause(r.Context())
	defer end(nil)
	s := &session{end: end}
	// Tracked before the directory answers, so that an End between its
	// answer and the Kopia server's reaches this session too.
	g.track(user, s)
	// Untracked even when the proxy aborts the stream by a panic
	// (http.ErrAbortHandler), as it does when End cuts it mid-response.
	defer g.untrack(user, s)
	if g.directory != nil {
		upstream, err := g.directory.Admits(r.Context(), user, password)
		if err != nil {
			ticket := r.Context().Value(loginKey{}).(*loginTicket)
			if r.Context().Err() != nil {
				// The guest went away while it waited for a hash: no
				// failure of its address's, which would slow its retry.
				ticket.done(loginUnknown)
				return
			}
			ticket.done(loginDenied)
			g.log.V(1).Info("session refused before the Kopia server", "user", user, "source", sourceOf(r.RemoteAddr), "why", err.Error())
			// Kopia's own words for a login it refuses, so that the
			// guest's client says "access denied" as it would there.
			writeGRPCError(w, grpcPermissionDenied, "access denied for "+user)
			return
		}
		// The proxy copies the guest's header: what Kopia reads is the
		// credential the directory chose.
		r.Header.Set("Kopia-Password", upstream)
	}
	SessionsStarted.Inc()
	if g.writes == nil {
		g.proxy.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	g.serveGuarded(w, r.WithContext(ctx), user, end)
}

// serveGuarded forwards session r of user, whose writes g.writes may
// refuse at each request (guardedBody, answerWriter); end ends it.
func (g *Gate) serveGuarded(w http.ResponseWriter, r *http.Request, user string, end context.CancelCauseFunc) {
	answers := &answerWriter{ResponseWriter: w}
	// Before the handler returns, even when the proxy aborts the stream
	// by a panic: the guest's body may still be read after it, and no
	// answer may be written then.
	defer answers.close()
	r.Body = &guardedBody{body: r.Body, user: user, guard: g.writes, answers: answers, end: end, log: g.log}
	g.proxy.ServeHTTP(answers, r)
	answers.close()
	// A session the gate ended after the Kopia server's headers went out
	// ends with the gate's status in the trailers (before them,
	// proxyError answered).
	if refused := refusalOf(r.Context()); refused != nil && answers.headersWritten() {
		h := w.Header()
		h.Del("Grpc-Status")
		h.Del("Grpc-Message")
		h.Set(http.TrailerPrefix+"Grpc-Status", strconv.Itoa(refused.code))
		h.Set(http.TrailerPrefix+"Grpc-Message", url.PathEscape(refused.message))
	}
}

// admitLogin waits until the login r may go to the Kopia server
// (loginLimiter.admit), and returns r carrying its ticket and the function
// the handler defers, which reports the login when the transport did not.
// When it may not, it answers r, or not at all when its guest went away,
// and returns false.
func (g *Gate) admitLogin(w http.ResponseWriter, r *http.Request) (*http.Request, func(), bool) {
	done, err := g.logins.admit(r.Context(), sourceOf(r.RemoteAddr))
	if err != nil {
		var throttled *throttledError
		switch {
		case errors.As(err, &throttled) && isGRPC(r):
			writeGRPCError(w, grpcUnavailable, throttled.Error())
		case errors.As(err, &throttled):
			w.Header().Set("Retry-After", "1")
			http.Error(w, throttled.Error(), http.StatusTooManyRequests)
		}
		return r, nil, false
	}
	login := &loginTicket{done: done}
	finish := func() {
		// Reported by the transport already, unless the proxy never got
		// that far, or the guest went away before the answer.
		if login.forwarded.Load() {
			done(loginAbandoned)
		} else {
			done(loginUnknown)
		}
	}
	return r.WithContext(context.WithValue(r.Context(), loginKey{}, login)), finish, true
}

// withFirstMessage reads the first gRPC message of session r before it is
// admitted, within firstMessageTimeout, and returns r with it put back in
// front of its body. A guest that sends none in time is answered
// Unavailable (its kopia retries) and never reaches the Kopia server.
func (g *Gate) withFirstMessage(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(firstMessageTimeout)); err != nil {
		writeGRPCError(w, grpcUnavailable, "the gate cannot time the session's first message")
		return r, false
	}
	first, err := readGRPCMessage(r.Body, maxFirstMessage)
	if err != nil {
		if r.Context().Err() == nil {
			writeGRPCError(w, grpcUnavailable, "no first session message: "+err.Error())
		}
		return r, false
	}
	if err := rc.SetReadDeadline(time.Time{}); err != nil {
		writeGRPCError(w, grpcUnavailable, "the gate cannot time the session")
		return r, false
	}
	out := r.Clone(r.Context())
	out.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(first), r.Body), r.Body}
	return out, true
}

// readGRPCMessage reads one length-prefixed gRPC message (its 5-byte
// prefix included) of at most limit bytes from body.
func readGRPCMessage(body io.Reader, limit int) ([]byte, error) {
	prefix := make([]byte, 5)
	if _, err := io.ReadFull(body, prefix); err != nil {
		return nil, fmt.Errorf("read its prefix: %w", err)
	}
	n := binary.BigEndian.Uint32(prefix[1:])
	if int64(n) > int64(limit) {
		return nil, fmt.Errorf("%d bytes, above %d", n, limit)
	}
	msg := make([]byte, 5+int(n))
	copy(msg, prefix)
	if _, err := io.ReadFull(body, msg[5:]); err != nil {
		return nil, fmt.Errorf("read %d bytes: %w", n, err)
	}
	return msg, nil
}

// End ends the open sessions of every user match accepts, and returns how
// many it ended of each. Their clients see their streams reset, and
// Kopia's reconnect, authenticating and being authorized again. An ended
// session is no longer counted, even while its stream winds down.
func (g *Gate) End(match func(user string) bool) map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	ended := map[string]int{}
	for user, sessions := range g.sessions {
		if !match(user) {
			continue
		}
		for s := range sessions {
			s.end(ErrSessionEnded)
			OpenSessions.Dec()
		}
		ended[user] = len(sessions)
		delete(g.sessions, user)
	}
	return ended
}

// Sessions returns how many sessions each user holds open now.
func (g *Gate) Sessions() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	open := make(map[string]int, len(g.sessions))
	for user, sessions := range g.sessions {
		open[user] = len(sessions)
	}
	return open
}

func (g *Gate) track(user string, s *session) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sessions[user] == nil {
		g.sessions[user] = map[*session]struct{}{}
	}
	g.sessions[user][s] = struct{}{}
	OpenSessions.Inc()
}

func (g *Gate) untrack(user string, s *session) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.sessions[user][s]; !ok {
		return // End took it
	}
	delete(g.sessions[user], s)
	if len(g.sessions[user]) == 0 {
		delete(g.sessions, user)
	}
	OpenSessions.Dec()
}

// proxyError answers a request the Kopia server did not, with gRPC
// Unavailable: a guest's client retries it within a command, as it does a
// server that restarts (though not for a command's first session).
func (g *Gate) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(context.Cause(r.Context()), ErrSessionEnded) {
		writeGRPCError(w, grpcUnavailable, ErrSessionEnded.Error())
		return
	}
	if refused := refusalOf(r.Context()); refused != nil {
		writeGRPCError(w, refused.code, refused.message)
		return
	}
	if r.Context().Err() != nil {
		return // the guest went away
	}
	g.log.Error(err, "the Kopia server in this pod did not answer", "path", r.URL.Path)
	if isGRPC(r) {
		writeGRPCError(w, grpcUnavailable, "the Kopia server in this pod does not answer yet")
		return
	}
	http.Error(w, "the Kopia server in this pod does not answer yet", http.StatusBadGateway)
}

// isGRPC is whether Kopia's server would take r for a gRPC call, of any
// protocol: it looks for a gRPC content type anywhere in the header
// (internal/server's handler), and the gate's connection to it is HTTP/2
// whatever the guest's is.
func isGRPC(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Content-Type"), "application/grpc")
}

// sessionCredentials are the Kopia user (user@host) a session
// authenticates as and its password: its metadata kopia-username,
// kopia-hostname and kopia-password, one value each, as Kopia's server
// requires (authenticateGRPCSession).
func sessionCredentials(h http.Header) (user, password string, ok bool) {
	u, host, p := h.Values("Kopia-Username"), h.Values("Kopia-Hostname"), h.Values("Kopia-Password")
	if len(u) != 1 || len(host) != 1 || len(p) != 1 {
		return "", "", false
	}
	return u[0] + "@" + host[0], p[0], true
}

// writeGRPCError answers a gRPC call with a status and no message
// ("trailers only"), which every gRPC client reads as the call's error.
func writeGRPCError(w http.ResponseWriter, code int, message string) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", strconv.Itoa(code))
	w.Header().Set("Grpc-Message", url.PathEscape(message))
	w.WriteHeader(http.StatusOK)
}
