package usersync_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/logins"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// gatedPod is a server pod's login path: a real Kopia server started with
// --htpasswd-file, user sync of its own BSLS writing that file, and the
// session gate asking user sync, on a loopback port.
type gatedPod struct {
	bsls   string
	client kubernetes.Interface
	server *testbed.KopiaServer
	syncer *usersync.Syncer
	// url is the gate's.
	url string
}

// startGatedPod starts a gatedPod of BSLS name, reading its users Secrets
// through config, every process stopped when tb ends.
func startGatedPod(tb testbed.TB, config *rest.Config, name string, log logr.Logger) *gatedPod {
	tb.Helper()
	return startGatedPodWriting(tb, config, name, log, "")
}

// startGatedPodWriting starts a gatedPod whose user sync writes the
// gate's credentials into htpasswd, when not empty, rather than into the
// file the Kopia server reads: a server that never loads them.
func startGatedPodWriting(tb testbed.TB, config *rest.Config, name string, log logr.Logger, htpasswd string) *gatedPod {
	tb.Helper()
	ctx := context.Background()
	p := &gatedPod{bsls: name, client: kubernetes.NewForConfigOrDie(config)}
	p.server = testbed.StartKopiaServer(tb, testbed.KopiaServerOptions{Htpasswd: true})
	r, err := repo.Open(ctx, p.server.ConfigFile, p.server.RepoPassword, &repo.Options{})
	if err != nil {
		tb.Fatalf("open repository: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close(context.Background()) })
	if htpasswd == "" {
		htpasswd = p.server.HtpasswdFile
	}
	p.syncer = usersync.New(usersync.Options{
		Client: p.client, Namespace: namespace, BSLS: name, Repository: r, Server: controlOf(tb, p.server),
		HtpasswdFile: htpasswd, Log: log,
	})
	cas := []*x509.Certificate{p.server.CA.Cert}
	gate, err := sessiongate.New(sessiongate.Options{Upstream: p.server.URL, TLS: serverpod.TrustChain(cas), Directory: p.syncer, Log: log})
	if err != nil {
		tb.Fatalf("gate: %v", err)
	}
	chain, key, err := testbed.WriteServingCert(tb.TempDir(), p.server.CA, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		tb.Fatalf("serving certificate: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	p.url = "https://" + ln.Addr().String()
	runCtx, stop := context.WithCancel(ctx)
	served, synced := make(chan error, 1), make(chan error, 1)
	go func() { served <- serverpod.ServeTLS(runCtx, ln, chain, key, gate.Server()) }()
	go func() { synced <- p.syncer.Run(runCtx) }()
	tb.Cleanup(func() {
		stop()
		for _, done := range []chan error{served, synced} {
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					tb.Fatalf("server pod: %v", err)
				}
			case <-time.After(30 * time.Second):
				tb.Fatalf("the server pod did not stop within 30 s")
			}
		}
	})
	return p
}

// setUsers writes every shard Secret of the pod's BSLS so that they list
// exactly users.
func (p *gatedPod) setUsers(tb testbed.TB, users map[string]identity.Hash) {
	tb.Helper()
	for shard := range userset.Shards {
		of := map[string]identity.Hash{}
		for u, h := range users {
			if userset.ShardOf(u) == shard {
				of[u] = h
			}
		}
		putShard(tb, p.client, p.bsls, shard, of)
	}
}

// open opens a session through the gate with a real Kopia client, as a
// guest's kopia command does (its connection and its session: two
// logins).
func (p *gatedPod) open(tb testbed.TB, user, password string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := testbed.OpenKopiaSession(ctx, tb, p.url, p.server.CAPin, user, password)
	if err != nil {
		return err
	}
	return r.Close(ctx)
}

// verifications reads logins.Verifications.
func verifications(by, result string) float64 {
	return testutil.ToFloat64(logins.Verifications.WithLabelValues(by, result))
}

// sameShard is a user in the users Secret of user, other than it: what
// the test changes along with user, so that seeing it changed proves the
// pod read user's change too.
func sameShard(user string) string {
	for i := 0; ; i++ {
		if other := fmt.Sprintf("marker-%d@team-l", i); userset.ShardOf(other) == userset.ShardOf(user) {
			return other
		}
	}
}

// The gate verifies every guest's password itself, remembers the ones it
// verified, and hands the Kopia server a credential of its own. These
// specs attack what it remembers with real Kopia clients.
var _ = Describe("Logins verified by the server pod's gate", Ordered, func() {
	var (
		pod            *gatedPod
		victim, marker guest
		users          map[string]identity.Hash
	)
	BeforeAll(func() {
		pod = startGatedPod(GinkgoT(), apiServer.Config, "logins", GinkgoLogr)
		victim = newGuest("victim@team-l")
		marker = newGuest(sameShard(victim.user))
		users = map[string]identity.Hash{victim.user: victim.hash}
		pod.setUsers(GinkgoT(), users)
		Eventually(func() error { return pod.open(GinkgoT(), victim.user, victim.password) }).WithTimeout(provisioned).Should(Succeed())
		Eventually(func() float64 { return testutil.ToFloat64(usersync.GateCredentialsLoaded) }).WithTimeout(provisioned).Should(Equal(1.0),
			"the server loaded the gate's credentials: guests' logins cost it no hash")
	})

	It("answers a returning guest from memory: its logins cost no hash", func() {
		hashed := verifications("hash", "match")
		remembered := verifications("memory", "match")
		Expect(pod.open(GinkgoT(), victim.user, victim.password)).To(Succeed())
		Expect(verifications("hash", "match")).To(Equal(hashed), "hashes for a returning guest")
		Expect(verifications("memory", "match")).To(BeNumerically(">=", remembered+1))

		remembered = verifications("memory", "match")
		Expect(pod.syncer.Authenticate(victim.user, victim.password)).To(BeTrue(), "a report to the client port, by the same path")
		Expect(verifications("hash", "match")).To(Equal(hashed), "hashes for a returning guest's report")
		Expect(verifications("memory", "match")).To(Equal(remembered + 1))
	})

	It("refuses a wrong password for a remembered user, at the cost of a hash, as for a user nobody lists", func() {
		mismatched := verifications("hash", "mismatch")
		Expect(pod.open(GinkgoT(), victim.user, "wrong-"+victim.password)).To(MatchError(ContainSubstring("access denied")))
		Expect(verifications("hash", "mismatch")).To(Equal(mismatched+1), "one hash for the wrong password")

		unknown := verifications("hash", "unknown-user")
		Expect(pod.open(GinkgoT(), "nobody@team-l", victim.password)).To(MatchError(ContainSubstring("access denied")))
		Expect(verifications("hash", "unknown-user")).To(Equal(unknown+1), "one hash for a user nobody lists")

		hashed := verifications("hash", "match")
		Expect(pod.open(GinkgoT(), victim.user, victim.password)).To(Succeed())
		Expect(verifications("hash", "match")).To(Equal(hashed), "hashes for the right password, which must still be remembered")
	})

	It("forgets nothing for a flood of wrong passwords: the remembered guest still costs no hash", func() {
		for i := range 12 {
			Expect(pod.open(GinkgoT(), victim.user, testbed.RandomPassword())).To(MatchError(ContainSubstring("access denied")), "wrong password %d", i)
		}
		hashed := verifications("hash", "match")
		Expect(pod.open(GinkgoT(), victim.user, victim.password)).To(Succeed())
		Expect(verifications("hash", "match")).To(Equal(hashed), "hashes for the remembered guest after the flood")
	})

	It("refuses the old password on the first session after the rotation is seen", func() {
		rotated := newGuest(victim.user)
		users = map[string]identity.Hash{rotated.user: rotated.hash, marker.user: marker.hash}
		pod.setUsers(GinkgoT(), users)
		// The marker shares the victim's Secret: once it logs in, the pod
		// has read the rotation.
		Eventually(func() error { return pod.open(GinkgoT(), marker.user, marker.password) }).WithTimeout(provisioned).Should(Succeed())
		Expect(pod.open(GinkgoT(), victim.user, victim.password)).To(MatchError(ContainSubstring("access denied")), "the old password")
		Eventually(func() error { return pod.open(GinkgoT(), rotated.user, rotated.password) }).WithTimeout(provisioned).Should(Succeed())
		Expect(pod.open(GinkgoT(), victim.user, victim.password)).To(MatchError(ContainSubstring("access denied")), "the old password, once the new one is remembered")
		victim = rotated
	})

	It("refuses a removed user on the first session after its removal is seen, though its password is remembered", func() {
		Expect(pod.open(GinkgoT(), victim.user, victim.password)).To(Succeed())
		users = map[string]identity.Hash{marker.user: newGuest(marker.user).hash}
		pod.setUsers(GinkgoT(), users)
		Eventually(func() error { return pod.open(GinkgoT(), marker.user, marker.password) }).WithTimeout(provisioned).Should(MatchError(ContainSubstring("access denied")),
			"the marker's rotation, in the victim's Secret")
		Expect(pod.open(GinkgoT(), victim.user, victim.password)).To(MatchError(ContainSubstring("access denied")))
	})
})

// Kopia's refresh answers OK even when its repository's refresh failed
// before it reloaded the htpasswd file. A gate that took that answer for
// the file loaded would hand every guest a credential the server refuses:
// no guest could log in until the next refresh, 4 hours away on a BSLS of
// one server. The server here never loads the file user sync writes.
var _ = Describe("A Kopia server that did not load the gate's credentials", func() {
	It("still lets a guest in with its own password, which the server verifies", func() {
		pod := startGatedPodWriting(GinkgoT(), apiServer.Config, "unloaded", GinkgoLogr, filepath.Join(GinkgoT().TempDir(), "htpasswd"))
		guest := newGuest("guest@team-u")
		pod.setUsers(GinkgoT(), map[string]identity.Hash{guest.user: guest.hash})
		Eventually(func() error { return pod.open(GinkgoT(), guest.user, guest.password) }).WithTimeout(provisioned).Should(Succeed())
		// A credential the server did not load would be refused: the
		// returning guest gets in only if the gate hands it none. (Not
		// GateCredentialsLoaded: that gauge is the process's, which the
		// suite's other syncers, whose servers did load theirs, set to 1
		// on their own passes.)
		Expect(pod.open(GinkgoT(), guest.user, guest.password)).To(Succeed(), "a returning guest")
	})
})
