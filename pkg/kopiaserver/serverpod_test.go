package kopiaserver_test

import (
	"context"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

const (
	serverNamespace = "backup"
	// provisioned bounds how long a Secret change may take to reach a guest.
	provisioned = 30 * time.Second
)

type guest struct{ user, password string }

var _ = Describe("A filesystem BSLS's server pod", Ordered, func() {
	var (
		ctx      context.Context
		api      *testbed.APIServer
		bsls     *v1alpha1.BackupStorageLocationServer
		ca       *pki.CA
		claimDir string
		binaries map[string]string
		pod      *testbed.Pod
		hashes   map[string]identity.Hash
		alice    = guest{"alice@team-a", testbed.RandomPassword()}
		bob      = guest{"bob@team-b", testbed.RandomPassword()}
	)

	put := func(obj client.Object) {
		GinkgoHelper()
		err := api.Client.Create(ctx, obj)
		if apierrors.IsAlreadyExists(err) {
			err = api.Client.Update(ctx, obj)
		}
		Expect(err).NotTo(HaveOccurred())
	}
	secret := func(name string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: serverNamespace}, Data: data}
	}
	// writeUsers writes every users shard, as the controller will.
	writeUsers := func(guests ...guest) {
		GinkgoHelper()
		shards := make([]map[string]identity.Hash, userset.Shards)
		for i := range shards {
			shards[i] = map[string]identity.Hash{}
		}
		for _, g := range guests {
			h, ok := hashes[g.user+g.password]
			if !ok { // hashed once per password, never again
				var err error
				// Bob's is PBKDF2: a BSLS whose hash choice changed
				// holds both kinds, and the server verifies each.
				version := identity.Scrypt
				if g.user == bob.user {
					version = identity.PBKDF2
				}
				h, err = identity.NewHash(g.password, version)
				Expect(err).NotTo(HaveOccurred())
				hashes[g.user+g.password] = h
			}
			shards[userset.ShardOf(g.user)][g.user] = h
		}
		for i, users := range shards {
			s := secret(userset.SecretName(bsls.Name, i), map[string][]byte{userset.Key: userset.Encode(users)})
			s.Labels = map[string]string{userset.Label: bsls.Name}
			put(s)
		}
	}
	runPod := func() *testbed.Pod {
		GinkgoHelper()
		deployment, err := kopiaserver.Deployment(bsls, kopiaserver.WorkloadInputs{Image: "guestbackup:test", TLSChecksum: "test"})
		Expect(err).NotTo(HaveOccurred())
		return testbed.RunPod(GinkgoT(), testbed.PodOptions{
			Namespace: serverNamespace,
			Spec:      deployment.Spec.Template.Spec,
			Binaries:  binaries,
			Claims:    map[string]string{kopiaserver.ClaimName(bsls): claimDir},
			API:       api,
		})
	}
	url := func(p *testbed.Pod) string { return "https://" + p.Addr(v1alpha1.DefaultServerPort) }
	connect := func(p *testbed.Pod, g guest) func() error {
		return func() error {
			out, err := testbed.NewKopiaClient(GinkgoT()).ConnectPinned(ctx, url(p), pki.Fingerprint(ca.Cert), g.user, g.password)
			if err != nil {
				return &kopiaError{err, out}
			}
			return nil
		}
	}

	BeforeAll(func() {
		ctx = context.Background()
		hashes = map[string]identity.Hash{}
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		binaries = serverBinaries(GinkgoT())
		claimDir = GinkgoT().TempDir()
		bsls = &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: serverNamespace},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage:    v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
				Access:     v1alpha1.AccessSpec{AppendOnly: true},
				Repository: v1alpha1.RepositorySpec{PathPrefix: "guests", DefaultPolicy: &v1alpha1.PolicySpec{Compression: "zstd"}},
				Replicas:   ptr.To[int32](1),
			},
		}
		Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: serverNamespace}})).To(Succeed())

		// What the reconciler will create: passwords, certificate, identity.
		var err error
		ca, err = pki.NewCA("backup/main CA", 24*time.Hour)
		Expect(err).NotTo(HaveOccurred())
		leaf, err := ca.IssueServing([]string{"main.backup.svc"}, nil, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		key, err := leaf.KeyPEM()
		Expect(err).NotTo(HaveOccurred())
		put(secret(kopiaserver.TLSSecretName(bsls), map[string][]byte{"tls.crt": pki.EncodeCert(leaf.Cert), "tls.key": key, "ca.crt": ca.CertPEM()}))
		put(secret(kopiaserver.RepositoryPassword(bsls).Name, map[string][]byte{"password": []byte(testbed.RandomPassword())}))
		put(secret(kopiaserver.ControlSecretName(bsls), map[string][]byte{"password": []byte(testbed.RandomPassword())}))
		sa, role, binding := kopiaserver.ServerRole(bsls)
		put(sa)
		put(role)
		put(binding)
		writeUsers(alice)
		// The reconciler creates it; the pod may only update it.
		put(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: maintenancestate.ConfigMapName(bsls.Name), Namespace: serverNamespace}})

		pod = runPod()
		Expect(pod.WaitReady(2 * time.Minute)).To(Succeed())
	})

	It("creates the repository under the path prefix on the claim", func() {
		Expect(filepath.Join(claimDir, "guests", "kopia.repository.f")).To(BeAnExistingFile())
	})

	It("runs Kopia's maintenance as guestbackup's owner and publishes it for the BSLS's status", func() {
		// A new repository has a full cycle due at once.
		Eventually(func(g Gomega) {
			cm := &corev1.ConfigMap{}
			g.Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: serverNamespace, Name: maintenancestate.ConfigMapName(bsls.Name)}, cm)).To(Succeed())
			s, err := maintenancestate.Decode(cm.Data[maintenancestate.Key])
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s).NotTo(BeNil())
			g.Expect(s.Owner).To(Equal("guestbackup-maintenance@main." + serverNamespace))
			g.Expect(s.LastCycle).To(Equal("full"))
			g.Expect(s.LastSuccess).NotTo(BeNil())
			g.Expect(s.NextRun).NotTo(BeNil())
			g.Expect(s.Failure).To(BeEmpty())
		}).WithTimeout(time.Minute).Should(Succeed())
		Eventually(func(g Gomega) {
			events := &corev1.EventList{}
			g.Expect(api.Client.List(ctx, events, client.InNamespace(serverNamespace))).To(Succeed())
			var reasons []string
			for _, e := range events.Items {
				reasons = append(reasons, e.Reason)
			}
			g.Expect(reasons).To(ContainElement("MaintenanceOwnerClaimed"))
		}).WithTimeout(time.Minute).Should(Succeed())
	})

	It("lets a guest in with only the URL, the CA pin and its own password", func() {
		Expect(connect(pod, alice)()).To(Succeed())
		Expect(connect(pod, guest{alice.user, "not the password"})()).To(MatchError(ContainSubstring("access denied")))
	})

	It("provisions a user whose Secret appears, within seconds", func() {
		writeUsers(alice, bob)
		Eventually(connect(pod, bob)).WithTimeout(provisioned).Should(Succeed())
	})

	It("keeps the users' snapshots apart", func() {
		aliceClient := testbed.NewKopiaClient(GinkgoT())
		out, err := aliceClient.ConnectPinned(ctx, url(pod), pki.Fingerprint(ca.Cert), alice.user, alice.password)
		Expect(err).NotTo(HaveOccurred(), out)
		data := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(data, "notes.txt"), []byte("alice's notes\n"), 0o600)).To(Succeed())
		out, err = aliceClient.Run(ctx, "snapshot", "create", data)
		Expect(err).NotTo(HaveOccurred(), out)

		bobClient := testbed.NewKopiaClient(GinkgoT())
		out, err = bobClient.ConnectPinned(ctx, url(pod), pki.Fingerprint(ca.Cert), bob.user, bob.password)
		Expect(err).NotTo(HaveOccurred(), out)
		out, err = bobClient.Run(ctx, "snapshot", "list", "--all")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).NotTo(ContainSubstring(data))
	})

	It("lets an append-only guest create and read its snapshots, but not delete them", func() {
		client := testbed.NewKopiaClient(GinkgoT())
		out, err := client.ConnectPinned(ctx, url(pod), pki.Fingerprint(ca.Cert), alice.user, alice.password)
		Expect(err).NotTo(HaveOccurred(), out)
		data := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(data, "ledger.txt"), []byte("history a guest must not erase\n"), 0o600)).To(Succeed())
		out, err = client.Run(ctx, "snapshot", "create", data)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := client.SnapshotIDs(ctx, data)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))

		out, err = client.Run(ctx, "snapshot", "delete", ids[0], "--delete")
		Expect(err).To(HaveOccurred(), "an append-only guest deleted its snapshot: %s", out)
		Expect(out).To(ContainSubstring("access denied"))
		Expect(client.SnapshotIDs(ctx, data)).To(Equal(ids))
		out, err = client.Run(ctx, "snapshot", "verify")
		Expect(err).NotTo(HaveOccurred(), out)

		By("keeping retention the admin's: the server applies a source's policy after each snapshot")
		out, err = client.Run(ctx, "policy", "set", data, "--keep-latest=1", "--keep-hourly=0", "--keep-daily=0", "--keep-weekly=0", "--keep-monthly=0", "--keep-annual=0")
		Expect(err).To(HaveOccurred(), "an append-only guest changed its retention: %s", out)
		Expect(out).To(ContainSubstring("access denied"))
		out, err = client.Run(ctx, "snapshot", "create", data)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(client.SnapshotIDs(ctx, data)).To(HaveLen(2))
	})

	It("refuses the old password and accepts the new one after a rotation", func() {
		old := alice
		alice.password = testbed.RandomPassword()
		writeUsers(alice, bob)
		Eventually(connect(pod, old)).WithTimeout(provisioned).Should(MatchError(ContainSubstring("access denied")))
		Expect(connect(pod, alice)()).To(Succeed())
	})

	It("refuses a user whose Secret entry is gone", func() {
		writeUsers(alice)
		Eventually(connect(pod, bob)).WithTimeout(provisioned).Should(MatchError(ContainSubstring("access denied")))
	})

	It("serves the same users from a second server on the same storage, before any sync", func() {
		// With a shard missing the second pod's user-sync changes nothing:
		// whatever authenticates comes from the repository itself.
		Expect(api.Client.Delete(ctx, secret(userset.SecretName(bsls.Name, 0), nil))).To(Succeed())
		second := runPod()
		Eventually(connect(second, alice)).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(),
			"the second server serves alice from the repository")
		Expect(second.WaitReady(5*time.Second, "user-sync")).To(MatchError(ContainSubstring("main-users-0")))
	})
})

type kopiaError struct {
	err error
	out string
}

func (e *kopiaError) Error() string { return e.err.Error() + ": " + e.out }

// serverBinaries are the local binaries that stand for the server image's
// commands (kopia for both architectures it serves, guestbackup-server),
// for testbed.RunPod.
func serverBinaries(tb testbed.TB) map[string]string {
	tb.Helper()
	tools := testbed.MustTools(tb)
	return map[string]string{
		kopiaserver.KopiaBinary:       tools.Kopia,
		kopiaserver.ClientBinaryARM64: tools.KopiaARM64,
		kopiaserver.ServerBinary:      testbed.Build(tb, "./cmd/server"),
	}
}
