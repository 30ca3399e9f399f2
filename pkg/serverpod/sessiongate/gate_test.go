package sessiongate_test

import (
	"context"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
	var err error
	gate, err = sessiongate.New(sessiongate.Options{
		Upstream: server.URL,
		TLS:      serverpod.TrustChain([]*x509.Certificate{server.CA.Cert}),
		Log:      GinkgoLogr,
	})
	Expect(err).NotTo(HaveOccurred())
	chain, key := servingCert()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	gateURL = "https://" + ln.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serverpod.ServeTLS(ctx, ln, chain, key, gate.Server()) }()
	DeferCleanup(func() {
		stop()
		Eventually(done).WithTimeout(30 * time.Second).Should(Receive(BeNil()))
	})
})

// servingCert writes a chain (leaf for 127.0.0.1, then the CA) and key the
// server's CA issued, as the gate presents the server's own.
func servingCert() (chainFile, keyFile string) {
	GinkgoHelper()
	kp, err := server.CA.IssueServing([]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	Expect(err).NotTo(HaveOccurred())
	keyPEM, err := kp.KeyPEM()
	Expect(err).NotTo(HaveOccurred())
	dir := GinkgoT().TempDir()
	chainFile, keyFile = filepath.Join(dir, "chain.pem"), filepath.Join(dir, "key.pem")
	Expect(os.WriteFile(chainFile, kp.ChainPEM(server.CA.Cert), 0o600)).To(Succeed())
	Expect(os.WriteFile(keyFile, keyPEM, 0o600)).To(Succeed())
	return chainFile, keyFile
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
	ctx := context.Background()
	user, host, _ := strings.Cut(username, "@")
	config := filepath.Join(GinkgoT().TempDir(), "repository.config")
	err := repo.ConnectAPIServer(ctx, config, &repo.APIServerInfo{BaseURL: gateURL, TrustedServerCertificateFingerprint: server.CAPin}, password,
		&repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: user, Hostname: host}})
	if err != nil {
		return nil, err
	}
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		return nil, err
	}
	DeferCleanup(func() { _ = r.Close(context.Background()) })
	return r, nil
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
