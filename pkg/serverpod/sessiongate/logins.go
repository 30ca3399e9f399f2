package sessiongate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Bounds of what logins may cost the Kopia server. Kopia verifies one
// password at a time per process, whoever is waiting for the answer, and
// goes on verifying a login whose client gave up: every login the gate
// hands it costs every guest a hash. So the gate hands Kopia only logins
// someone still waits for, a few at a time, and lets no address queue many
// of them, or keep trying fast with passwords that fail.
const (
	// DefaultLoginsInFlight is how many logins the Kopia server is given
	// at once: enough to keep its hash busy, few enough that a login
	// whose guest went away meanwhile costs little.
	DefaultLoginsInFlight = 2
	// DefaultLoginsPerSource is how many logins one address may have
	// waiting or being verified at once; more are refused at once.
	DefaultLoginsPerSource = 16
	// activePerSource is how many of them are admitted at once: waiting
	// for a place at the Kopia server, or there. An address whose last
	// login failed has one at a time.
	activePerSource = 4
	// DefaultConnectionsPerSource bounds the connections one address
	// holds to the gate: a guest's kopia needs one or two.
	DefaultConnectionsPerSource = 64

	// loginBackoffBase and loginBackoffMax: after a failed login, the
	// address's next one waits base, doubled for each failure in a row,
	// at most max, before it is queued.
	loginBackoffBase = 100 * time.Millisecond
	loginBackoffMax  = time.Second
	// loginAnswerTimeout frees a login's place at the Kopia server when
	// no answer came: Kopia answers a session it accepted only once its
	// client has sent the first message, which a client may hold back.
	loginAnswerTimeout = 10 * time.Second
	// minAnswerTime is the least an abandoned login is taken to cost the
	// Kopia server.
	minAnswerTime = 100 * time.Millisecond
	// failureMemory: failures older than this are forgiven.
	failureMemory = time.Minute
	// sweepAt is how many addresses the limiter remembers before it
	// forgets those with nothing pending and no recent failure.
	sweepAt = 1024
)

// LoginsThrottled counts the logins the gate refused before they reached
// the Kopia server, because their address had too many waiting
// (guestbackup_server_logins_throttled_total).
var LoginsThrottled = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "guestbackup_server_logins_throttled_total",
	Help: "Logins refused by the session gate before they cost the Kopia server a hash: their address had too many waiting.",
})

// loginResult is what the Kopia server answered a login.
type loginResult int

const (
	// loginUnknown: no answer, and none asked for (the guest went away
	// before its login was forwarded, the server did not answer): neither
	// counts.
	loginUnknown loginResult = iota
	loginAccepted
	loginRefused
	// loginAbandoned: the guest went away after its login was forwarded.
	// Kopia verifies the password all the same (it does not look at the
	// client), so the login keeps its place there for about as long as a
	// login takes, and counts as a failure of its address.
	loginAbandoned
	// loginDenied: the gate refused it itself (Directory), without the
	// Kopia server. It counts as a failure of its address, but says
	// nothing of how long the Kopia server takes to answer.
	loginDenied
)

// loginLimiter admits logins to the Kopia server.
type loginLimiter struct {
	clock clock.WithDelayedExecution
	// inFlight holds a place for each login the Kopia server has.
	inFlight chan struct{}
	// perSource bounds the logins an address has waiting or admitted.
	perSource int

	mu      sync.Mutex
	sources map[string]*loginSource
	// answer is how long the Kopia server has been taking to answer a
	// login, a moving average: what an abandoned login still costs it.
	answer time.Duration
}

// loginSource is what the limiter knows of one address.
type loginSource struct {
	// pending are its logins the limiter holds, waiting their turn or
	// admitted; active those admitted (waiting out a backoff or a place
	// at the Kopia server, or there).
	pending, active int
	// waiters are the turns of the others, first come first served.
	waiters []chan struct{}
	// failures are its refused logins in a row; lastFailure the latest.
	failures    int
	lastFailure time.Time
}

func newLoginLimiter(c clock.WithDelayedExecution, inFlight, perSource int) *loginLimiter {
	return &loginLimiter{clock: c, inFlight: make(chan struct{}, inFlight), perSource: perSource, sources: map[string]*loginSource{}}
}

// throttledError is a login refused because its address has too many
// waiting.
type throttledError struct {
	source  string
	pending int
}

func (e *throttledError) Error() string {
	return fmt.Sprintf("too many logins at once from %s (%d waiting): retry shortly", e.source, e.pending)
}

// admit waits until a login from address source may go to the Kopia
// server, and returns the function to call with the server's answer. An
// address's logins take turns: activePerSource at once, one at a time
// after a failure, and then only once a backoff since it has passed. admit
// gives up, with ctx's cause, as soon as the guest does, so a login nobody
// waits for never reaches the server. A login over the address's bound
// (perSource) is refused at once, with a *throttledError.
func (l *loginLimiter) admit(ctx context.Context, source string) (func(loginResult), error) {
	l.mu.Lock()
	s := l.source(source, l.clock.Now())
	if s.pending >= l.perSource {
		l.mu.Unlock()
		LoginsThrottled.Inc()
		return nil, &throttledError{source: source, pending: s.pending}
	}
	s.pending++
	turn := make(chan struct{})
	s.waiters = append(s.waiters, turn)
	l.grant(s)
	l.mu.Unlock()

	select {
	case <-turn:
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		select {
		case <-turn: // granted meanwhile
			l.finishLocked(source, loginUnknown)
		default:
			s.waiters = slices.DeleteFunc(s.waiters, func(c chan struct{}) bool { return c == turn })
			s.pending--
			l.forget(source, s)
		}
		return nil, context.Cause(ctx)
	}

	l.mu.Lock()
	wait := time.Duration(0)
	if s.failures > 0 {
		backoff := loginBackoffBase << min(s.failures-1, 8)
		wait = s.lastFailure.Add(min(backoff, loginBackoffMax)).Sub(l.clock.Now())
	}
	l.mu.Unlock()
	if wait > 0 {
		t := l.clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			l.finish(source, loginUnknown)
			return nil, context.Cause(ctx)
		}
	}
	select {
	case l.inFlight <- struct{}{}:
	case <-ctx.Done():
		l.finish(source, loginUnknown)
		return nil, context.Cause(ctx)
	}
	var once sync.Once
	forwarded := l.clock.Now()
	done := func(r loginResult) {
		once.Do(func() {
			switch r {
			case loginAccepted, loginRefused:
				l.observe(l.clock.Since(forwarded))
			case loginAbandoned:
				l.clock.AfterFunc(l.answerTime(), func() { <-l.inFlight })
				l.finish(source, loginRefused)
				return
			}
			<-l.inFlight
			l.finish(source, r)
		})
	}
	timeout := l.clock.AfterFunc(loginAnswerTimeout, func() { done(loginUnknown) })
	return func(r loginResult) {
		timeout.Stop()
		done(r)
	}, nil
}

// observe takes a login's answer time into the moving average.
func (l *loginLimiter) observe(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.answer == 0 {
		l.answer = d
		return
	}
	l.answer = (4*l.answer + d) / 5
}

// answerTime is what an abandoned login is taken to cost the server:
// the average answer time, within bounds.
func (l *loginLimiter) answerTime() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return min(max(l.answer, minAnswerTime), loginAnswerTimeout)
}

// grant gives s's first waiters their turn while it has room: an address
// whose last login failed has one login admitted at a time. l.mu is held.
func (l *loginLimiter) grant(s *loginSource) {
	limit := activePerSource
	if s.failures > 0 {
		limit = 1
	}
	for len(s.waiters) > 0 && s.active < limit {
		close(s.waiters[0])
		s.waiters = s.waiters[1:]
		s.active++
	}
}

// source is the entry of address a, made when there is none; failures
// older than failureMemory are forgiven. l.mu is held.
func (l *loginLimiter) source(a string, now time.Time) *loginSource {
	s := l.sources[a]
	if s == nil {
		if len(l.sources) >= sweepAt {
			l.sweep(now)
		}
		s = &loginSource{}
		l.sources[a] = s
	}
	if s.failures > 0 && now.Sub(s.lastFailure) > failureMemory {
		s.failures = 0
	}
	return s
}

// sweep forgets the addresses that have nothing pending and no failure
// to remember. l.mu is held.
func (l *loginLimiter) sweep(now time.Time) {
	for a, s := range l.sources {
		if s.pending == 0 && (s.failures == 0 || now.Sub(s.lastFailure) > failureMemory) {
			delete(l.sources, a)
		}
	}
}

// finish records the answer to one of source's admitted logins.
func (l *loginLimiter) finish(source string, r loginResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.finishLocked(source, r)
}

// finishLocked is finish with l.mu held.
func (l *loginLimiter) finishLocked(source string, r loginResult) {
	s := l.sources[source]
	if s == nil {
		return
	}
	s.pending--
	s.active--
	switch r {
	case loginAccepted:
		s.failures = 0
	case loginRefused, loginDenied:
		s.failures++
		s.lastFailure = l.clock.Now()
	}
	l.grant(s)
	l.forget(source, s)
}

// forget drops source's entry when it holds nothing worth keeping. l.mu
// is held.
func (l *loginLimiter) forget(source string, s *loginSource) {
	if s.pending == 0 && s.failures == 0 {
		delete(l.sources, source)
	}
}

// sourceOf is the address a request came from, without its port (an IPv4
// address mapped into IPv6 counts as itself).
func sourceOf(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().WithZone("").String()
	}
	return host
}

// isLogin is whether r makes the Kopia server verify a password: a gRPC
// session (its credentials in the metadata) or any other request that
// carries an Authorization header (Kopia's HTTP API checks basic
// credentials on each).
func isLogin(r *http.Request) bool {
	return isGRPC(r) || r.Header.Get("Authorization") != ""
}

// sessionAnswer is the body of the Kopia server's answer to a session,
// which tells how its login went: a session it accepted starts with a
// message, one it refused ends at once with a status.
type sessionAnswer struct {
	io.ReadCloser
	res  *http.Response
	done func(loginResult)
}

func (b *sessionAnswer) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case n > 0:
		b.done(loginAccepted)
	case errors.Is(err, io.EOF):
		b.done(resultOf(b.res))
	case err != nil:
		b.done(loginUnknown)
	}
	return n, err
}

func (b *sessionAnswer) Close() error {
	b.done(loginUnknown)
	return b.ReadCloser.Close()
}

// resultOf reads the Kopia server's answer to a login from its status: a
// gRPC status in the headers (trailers only) or the trailers, or the HTTP
// status of its HTTP API, which answers 401 or 403 to wrong credentials.
func resultOf(res *http.Response) loginResult {
	status := res.Header.Get("Grpc-Status")
	if status == "" {
		status = res.Trailer.Get("Grpc-Status")
	}
	if status != "" {
		if status == "0" {
			return loginAccepted
		}
		if status == "7" || status == "16" { // PermissionDenied, Unauthenticated
			return loginRefused
		}
		return loginUnknown
	}
	switch {
	case res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden:
		return loginRefused
	case res.StatusCode >= 200 && res.StatusCode < 300:
		return loginAccepted
	}
	return loginUnknown
}

// connections counts the connections of each address, to bound them.
type connections struct {
	max int
	mu  sync.Mutex
	of  map[string]int
}

// open counts a new connection from source, and reports whether it is
// within the bound; one that is not must be closed, and is not counted.
func (c *connections) open(source string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.of[source] >= c.max {
		return false
	}
	c.of[source]++
	return true
}

// close uncounts a connection open counted.
func (c *connections) close(source string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.of[source]--; c.of[source] <= 0 {
		delete(c.of, source)
	}
}
