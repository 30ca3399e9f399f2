package sessiongate_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

func TestSessionGate(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	RunSpecs(t, "The session gate in front of a real Kopia server")
}

// callTimeout bounds one call of a Kopia client, reconnection included.
const callTimeout = time.Minute

// refusedWithin is how long a spec lets a refused client retry: Kopia's
// retries a session the server refuses for about two minutes before it
// gives up, so its call is judged by whether it succeeds within this.
const refusedWithin = 20 * time.Second

var (
	server *testbed.KopiaServer
	gate   *sessiongate.Gate
	// gateURL is the gate's port, as guests reach it.
	gateURL string
)

// The gate runs as in a server pod: in front of a real kopia server on
// loopback, presenting a certificate of the server's CA, its guests real
// Kopia clients (Kopia's own client library, the code behind the CLI).
var _ = BeforeSuite(func() {
	server = testbed.StartKopiaServer(GinkgoT(), testbed.KopiaServerOptions{})
	// A write guard, as user sync always gives one; it refuses nobody
	// here, so that every session goes through its path.
	gate, gateURL = startGate(sessiongate.Options{Writes: &writeGuard{}})
})

// startGate serves a gate of options o in front of the suite's Kopia
// server (serveGate) until the calling container ends.
func startGate(o sessiongate.Options) (*sessiongate.Gate, string) {
	GinkgoHelper()
	o.Log = GinkgoLogr
	return serveGate(GinkgoT(), server, o)
}

// holdSession connects Kopia's client to the gate as username and opens
// the repository: one gRPC session, held until the spec ends.
func holdSession(username, password string) repo.Repository {
	GinkgoHelper()
	r, err := holdSessionErr(username, password)
	Expect(err).NotTo(HaveOccurred())
	Expect(call(r)).To(Succeed(), "%s reads through its session", username)
	return r
}

func holdSessionErr(username, password string) (repo.Repository, error) {
	return holdSessionAt(gateURL, username, password)
}

// holdSessionAt is holdSessionErr through the gate at url.
func holdSessionAt(url, username, password string) (repo.Repository, error) {
	return testbed.OpenKopiaSession(context.Background(), GinkgoT(), url, server.CAPin, username, password)
}

// call sends one request on r's session: what a mounted snapshot or a long
// command does again and again.
func call(r repo.Repository) error { return callWithin(r, callTimeout) }

func callWithin(r repo.Repository, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: "snapshot"})
	return err
}

// sessionsStarted counts the sessions the Kopia server opened for
// username, from its own log.
func sessionsStarted(username string) int {
	return strings.Count(server.Process.Log(), `starting session for user "`+username+`"`)
}

var _ = Describe("The session gate", Ordered, func() {
	const (
		alice = "alice@team-a"
		bob   = "bob@team-a"
	)
	var (
		alicePassword, bobPassword = testbed.RandomPassword(), testbed.RandomPassword()
		aliceRepo, bobRepo         repo.Repository
		// aliceStarted and bobStarted are the sessions the server had
		// started for each once they held theirs (connecting opens one
		// of its own).
		aliceStarted, bobStarted int
	)
	BeforeAll(func() {
		server.AddUser(GinkgoT(), alice, alicePassword)
		server.AddUser(GinkgoT(), bob, bobPassword)
		aliceRepo = holdSession(alice, alicePassword)
		bobRepo = holdSession(bob, bobPassword)
		aliceStarted, bobStarted = sessionsStarted(alice), sessionsStarted(bob)
	})

	It("keeps each guest's session under the Kopia user it authenticates as", func() {
		Expect(gate.Sessions()).To(Equal(map[string]int{alice: 1, bob: 1}))
		Expect(call(aliceRepo)).To(Succeed())
		Expect(sessionsStarted(alice)).To(Equal(aliceStarted), "one session serves every call")
	})

	It("ends the sessions of the users chosen, whose clients reconnect, and no one else's", func() {
		Expect(gate.End(func(user string) bool { return user == alice })).To(Equal(map[string]int{alice: 1}))
		Expect(call(aliceRepo)).To(Succeed(), "alice's client reconnects, as Kopia's does after a server restart")
		Expect(sessionsStarted(alice)).To(Equal(aliceStarted+1), "alice's client opened a new session")
		Expect(call(bobRepo)).To(Succeed())
		Expect(sessionsStarted(bob)).To(Equal(bobStarted), "bob's session was never ended")
		Expect(gate.Sessions()).To(Equal(map[string]int{alice: 1, bob: 1}))
	})

	It("makes Kopia authenticate a held session again: a deleted user's ends with End", func() {
		Expect(server.SetUsers(context.Background(), nil, alice)).To(Succeed())
		Expect(call(aliceRepo)).To(Succeed(), "Kopia authorizes a session once, when it opens: alice's held session outlives her user")
		Expect(gate.End(func(user string) bool { return user == alice })).To(Equal(map[string]int{alice: 1}))
		Expect(callWithin(aliceRepo, refusedWithin)).NotTo(Succeed(), "alice's client reconnects and is refused")
		Expect(call(bobRepo)).To(Succeed())
		_, err := holdSessionErr(alice, alicePassword)
		Expect(err).To(MatchError(ContainSubstring("access denied")), "what alice's client is told")
	})

	It("passes the Kopia server's other requests on as they are", func() {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: serverpod.TrustChain([]*x509.Certificate{server.CA.Cert})}}
		resp, err := c.Get(gateURL + "/metrics")
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		Expect(string(body)).To(ContainSubstring("kopia_"), "Kopia's own /metrics")
	})

	It("refuses a session sent over HTTP/1.1, which it could not end", func() {
		// A hostile guest offers HTTP/1.1 alone and sends Kopia's session
		// call by hand, its body held open as a session's is; the gate's
		// own connection to Kopia is HTTP/2, where Kopia would take it.
		tlsConfig := serverpod.TrustChain([]*x509.Certificate{server.CA.Cert})
		tlsConfig.NextProtos = []string{"http/1.1"}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: false}}
		body, hold := io.Pipe()
		DeferCleanup(hold.Close)
		ctx, cancel := context.WithTimeout(context.Background(), refusedWithin)
		defer cancel()
		// A request still sending gives up with its context only once its
		// body ends.
		context.AfterFunc(ctx, func() { hold.CloseWithError(ctx.Err()) })
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateURL+"/kopia_repository.KopiaRepository/Session", body)
		Expect(err).NotTo(HaveOccurred())
		req.Close = true
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		req.Header.Set("Kopia-Username", "bob")
		req.Header.Set("Kopia-Hostname", "team-a")
		req.Header.Set("Kopia-Password", bobPassword)
		before, open := sessionsStarted(bob), gate.Sessions()

		resp, err := c.Do(req)
		Expect(err).NotTo(HaveOccurred(), "the gate answers at once")
		defer resp.Body.Close()
		Expect(resp.ProtoMajor).To(Equal(1))
		Expect(resp.StatusCode).To(Equal(http.StatusHTTPVersionNotSupported))
		Expect(gate.Sessions()).To(Equal(open))
		Expect(sessionsStarted(bob)).To(Equal(before), "Kopia started no session")
	})
})

// directoryFunc is a sessiongate.Directory: user sync's stands behind it in
// a server pod.
type directoryFunc func(user, password string) error

// Admits leaves the password to the Kopia server.
func (f directoryFunc) Admits(_ context.Context, user, password string) (string, error) {
	return password, f(user, password)
}

// The Kopia server knows the users user sync could write into the
// repository; on a full storage a deleted VM's user stays there, and its
// leaked password would still log in. The gate asks the directory first,
// and the Kopia server never sees the login.
var _ = Describe("A session of a user the directory does not admit", Ordered, func() {
	const (
		removed = "removed@team-c"
		listed  = "listed@team-c"
	)
	var (
		removedPassword, listedPassword = testbed.RandomPassword(), testbed.RandomPassword()
		url                             string
		// removedAsked counts the directory's answers about removed.
		removedAsked atomic.Int32
	)
	BeforeAll(func() {
		server.AddUser(GinkgoT(), removed, removedPassword)
		server.AddUser(GinkgoT(), listed, listedPassword)
		_, url = startGate(sessiongate.Options{Directory: directoryFunc(func(user, password string) error {
			if user == removed {
				removedAsked.Add(1)
			}
			if user != listed || password != listedPassword {
				return errors.New("not listed")
			}
			return nil
		})})
	})

	It("is refused by the gate as Kopia refuses a wrong password, and never reaches the Kopia server", func() {
		before := sessionsStarted(removed)
		_, err := holdSessionAt(url, removed, removedPassword)
		Expect(err).To(MatchError(ContainSubstring("access denied")), "what the removed user's client is told")
		Expect(sessionsStarted(removed)).To(Equal(before), "the Kopia server, which still holds the user, started no session for it")
		Expect(removedAsked.Load()).To(BeNumerically(">", 0), "the gate asked the directory")
	})

	It("lets a user the directory admits log in", func() {
		r, err := holdSessionAt(url, listed, listedPassword)
		Expect(err).NotTo(HaveOccurred())
		Expect(call(r)).To(Succeed())
	})
})

// Anyone who reaches the port can send logins with wrong passwords, and
// Kopia verifies one password at a time for everyone. The gate hands Kopia
// few of them, and none whose client went away.
var _ = Describe("A flood of wrong logins from one address", Ordered, func() {
	const victim = "victim@team-b"
	var (
		victimPassword = testbed.RandomPassword()
		victimConfig   string
		mallory        *attacker
	)
	BeforeAll(func() {
		server.AddUser(GinkgoT(), victim, victimPassword)
		var err error
		victimConfig, err = connectClient(context.Background(), gateURL, server.CAPin, GinkgoT().TempDir(), victim, victimPassword)
		Expect(err).NotTo(HaveOccurred())
		mallory = newAttacker(gateURL, server.CA.Cert, net.IPv4(127, 0, 0, 2))
		DeferCleanup(mallory.close)
	})

	It("lets the address queue a few logins, which reach Kopia one at a time; the rest are refused by the gate at once", func() {
		const senders = 64
		res := mallory.flood(context.Background(), victim, senders, 1)
		Expect(res.other).To(BeZero(), "every login is answered: %s", res)
		Expect(res.refused + res.throttled).To(Equal(senders))
		Expect(res.throttled).To(BeNumerically(">=", senders/2), "the gate keeps most of a flood from Kopia: %s", res)
	})

	It("lets a guest of another address log in while the flood goes on", func() {
		ctx, stop := context.WithCancel(context.Background())
		flooded := make(chan floodResult, 1)
		go func() { flooded <- mallory.flood(ctx, victim, 64, 1000) }()
		DeferCleanup(func() {
			stop()
			Eventually(flooded).WithTimeout(callTimeout).Should(Receive())
		})
		for range 3 {
			call, cancel := context.WithTimeout(context.Background(), callTimeout)
			Expect(loginWith(call, victimConfig, victimPassword)).To(Succeed())
			cancel()
		}
	})
})

// Connections cost the pod a file descriptor each, and an upstream
// transport; no address may hold many, and none stays idle long.
var _ = Describe("Connections held open by one address", func() {
	It("are bounded per address, and closed when idle", func() {
		const bound = 4
		_, url := startGate(sessiongate.Options{ConnectionsPerSource: bound, IdleTimeout: 2 * time.Second})
		pool := x509.NewCertPool()
		pool.AddCert(server.CA.Cert)
		dial := func(ip net.IP) (*tls.Conn, error) {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 10 * time.Second}
			c, err := tls.DialWithDialer(d, "tcp", strings.TrimPrefix(url, "https://"), &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
			if err != nil {
				return nil, err
			}
			DeferCleanup(c.Close)
			// A client's connection preface and empty SETTINGS, as any
			// HTTP/2 client opens with: the server's idle time counts from
			// there (before it, its own preface timeout would close it).
			preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)
			if _, err := c.Write(preface); err != nil {
				return nil, err
			}
			// The handshake's end on this side does not say the server
			// kept the connection: its first frame (HTTP/2's SETTINGS) does.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != nil {
				return nil, err
			}
			return c, nil
		}
		held := []*tls.Conn{}
		for range bound {
			c, err := dial(net.IPv4(127, 0, 0, 3))
			Expect(err).NotTo(HaveOccurred())
			held = append(held, c)
		}
		_, err := dial(net.IPv4(127, 0, 0, 3))
		Expect(err).To(HaveOccurred(), "a connection over the address's bound is closed at once")
		_, err = dial(net.IPv4(127, 0, 0, 4))
		Expect(err).NotTo(HaveOccurred(), "another address is not bound by it")

		By("the idle connections being closed by the gate")
		for _, c := range held {
			Eventually(func() error {
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				_, err := io.Copy(io.Discard, c)
				if err == nil {
					return nil // EOF: closed
				}
				return err
			}).WithTimeout(callTimeout).Should(Succeed())
		}
		_, err = dial(net.IPv4(127, 0, 0, 3))
		Expect(err).NotTo(HaveOccurred(), "the address may connect again once its connections are gone")
	})
})
