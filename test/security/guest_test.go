package security

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// guestACLSyncTimeout bounds user sync acting on a users Secret change.
const guestACLSyncTimeout = 60 * time.Second

// guestACL is an access rule as Kopia stores it in a manifest of type
// "acl" (internal/acl.Entry of Kopia v0.23.1), as an attacker writes it.
type guestACL struct {
	User   string            `json:"user"`
	Target map[string]string `json:"target"`
	Access string            `json:"access"`
}

// guestTakeoverACLs are the rules the measured attack wrote: FULL on every
// snapshot, policy, user profile and ACL, for the attacker.
func guestTakeoverACLs(username string) []guestACL {
	var out []guestACL
	for _, typ := range []string{"snapshot", "policy", "user", "acl"} {
		out = append(out, guestACL{User: username, Target: map[string]string{manifest.TypeLabelKey: typ}, Access: "FULL"})
	}
	return out
}

// guestOpen connects Kopia's own client library to s as username, as the
// kopia CLI does (it is the code behind the CLI), so that a spec can send
// the requests the CLI has no command for: PutManifest with any labels.
func guestOpen(s Server, username, password string) repo.Repository {
	GinkgoHelper()
	r := guestSession(s, username, password)
	DeferCleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// guestSession is guestOpen for a session that outlives the spec that
// opens it: one gRPC session, held until the caller closes it.
func guestSession(s Server, username, password string) repo.Repository {
	GinkgoHelper()
	user, host, _ := strings.Cut(username, "@")
	config := filepath.Join(GinkgoT().TempDir(), "repository.config")
	Expect(repo.ConnectAPIServer(ctx, config, &repo.APIServerInfo{BaseURL: s.URL, TrustedServerCertificateFingerprint: s.Pin}, password,
		&repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: user, Hostname: host}})).To(Succeed())
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	return r
}

// guestForgeACLs writes acls as manifests labelled with the attacker's own
// user and host, which Kopia's legacy rules let a user write.
func guestForgeACLs(r repo.Repository, username string, acls []guestACL) error {
	user, host, _ := strings.Cut(username, "@")
	return repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "attack"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		for _, a := range acls {
			if _, err := w.PutManifest(ctx, map[string]string{manifest.TypeLabelKey: "acl", "username": user, "hostname": host}, a); err != nil {
				return err
			}
		}
		return nil
	})
}

// guestAdminOpen opens s's repository as a holder of the repository
// password does (an admin, or whoever stole it): directly, through the
// connection the server pod's init container wrote.
func guestAdminOpen(s Server) repo.Repository {
	GinkgoHelper()
	var config string
	for _, a := range s.Pod.Containers["user-sync"].Spec.Args {
		if v, ok := strings.CutPrefix(a, "--config-file="); ok {
			config = v
		}
	}
	Expect(config).NotTo(BeEmpty(), "the user-sync container's --config-file")
	sel := kopiaserver.RepositoryPassword(s.BSLS)
	secret := &corev1.Secret{}
	Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: s.BSLS.Namespace, Name: sel.Name}, secret)).To(Succeed())
	r, err := repo.Open(ctx, config, string(secret.Data[sel.Key]), &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// guestACLManifests lists the ACL manifests of the repository, as a
// password holder sees them.
func guestACLManifests(r repo.Repository) []*manifest.EntryMetadata {
	GinkgoHelper()
	Expect(r.Refresh(ctx)).To(Succeed())
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: "acl"})
	Expect(err).NotTo(HaveOccurred())
	return entries
}

// guestNudgeUserSync changes a users Secret's annotations, as anything
// touching it does, so that user sync runs now rather than at its next
// resync (5 minutes).
func guestNudgeUserSync(b *v1alpha1.BackupStorageLocationServer, why string) {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: userset.SecretName(b.Name, 0)}, s)).To(Succeed())
	patch := client.MergeFrom(s.DeepCopy())
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations["security.test/nudge"] = why
	Expect(platform.API.Client.Patch(ctx, s, patch)).To(Succeed())
}

// guestSnapshot snapshots a folder holding content as the client and
// returns the folder.
func guestSnapshot(c *testbed.KopiaClient, content string, extra ...string) string {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	Expect(os.WriteFile(filepath.Join(dir, "data.txt"), []byte(content), 0o600)).To(Succeed())
	out, err := c.Run(ctx, append([]string{"snapshot", "create", dir}, extra...)...)
	Expect(err).NotTo(HaveOccurred(), out)
	return dir
}

// guestBSLSEvents returns the Events on b, as "Type Reason: message".
func guestBSLSEvents(b *v1alpha1.BackupStorageLocationServer) func() []string {
	return func() []string {
		events, err := platform.Events(ctx, b.Namespace, "BackupStorageLocationServer", b.Name)
		Expect(err).NotTo(HaveOccurred())
		return events
	}
}

var _ = Describe("A guest taking over the repository through ACL manifests", func() {
	for _, appendOnly := range []bool{false, true} {
		mode := map[bool]string{false: "default", true: "append-only"}[appendOnly]
		short := map[bool]string{false: "def", true: "ao"}[appendOnly]

		It(fmt.Sprintf("is refused in %s mode; ACLs guestbackup did not write are removed and reported; the victim is intact", mode), func() {
			// The server's namespace, an attacker's and a victim's: two
			// teams sharing one BSLS, as a platform team would set it up.
			selector := map[string]string{"security.test/acl": short}
			serverNS, attackerNS, victimNS := "acl-"+short+"-backup", "acl-"+short+"-mallory", "acl-"+short+"-alice"
			newNamespace(serverNS, selector)
			newNamespace(attackerNS, selector)
			newNamespace(victimNS, selector)
			s := serveBSLS(bslsFor(serverNS, "shared", selector, appendOnly))
			server := serverNS + "/shared"
			attackerTenant, victimTenant := newTenant("mallory-"+short, attackerNS), newTenant("alice-"+short, victimNS)
			createVM(attackerTenant.Client, attackerNS, "web", server)
			createVM(victimTenant.Client, victimNS, "db", server)
			attacker, attackerPassword := waitProvisioned(s, attackerNS, "web")
			victim, victimPassword := waitProvisioned(s, victimNS, "db")

			victimClient, err := loginAs(s, victim, victimPassword)
			Expect(err).NotTo(HaveOccurred())
			victimDir := guestSnapshot(victimClient, "alice's database dump\n")
			victimSnapshots, err := victimClient.SnapshotIDs(ctx, victimDir)
			Expect(err).NotTo(HaveOccurred())
			Expect(victimSnapshots).To(HaveLen(1))

			By("the guest writing ACL manifests that grant itself FULL, labelled with its own user and host")
			err = guestForgeACLs(guestOpen(s, attacker, attackerPassword), attacker, guestTakeoverACLs(attacker))
			Expect(err).To(MatchError(ContainSubstring("access denied")), "the guest wrote ACL manifests")

			By("a holder of the repository password writing one anyway: user sync removes it and says so")
			admin := guestAdminOpen(s)
			before := len(guestACLManifests(admin))
			Expect(before).NotTo(BeZero(), "guestbackup keeps explicit ACLs in every mode")
			forged := guestTakeoverACLs(attacker)[0]
			Expect(repo.WriteSession(ctx, admin, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
				_, err := w.PutManifest(ctx, map[string]string{manifest.TypeLabelKey: "acl"}, forged)
				return err
			})).To(Succeed())
			// Whether the forged manifest is still there when looked at
			// depends on when user sync's next pass runs; the Event below
			// proves it was there and was removed.
			guestNudgeUserSync(s.BSLS, "foreign ACL written")
			Eventually(guestBSLSEvents(s.BSLS)).WithTimeout(guestACLSyncTimeout).Should(ContainElement(And(
				HavePrefix("Warning "+usersync.ReasonForeignACLRemoved+": "),
				ContainSubstring(attacker+" FULL type=snapshot"))), "a Warning Event on the BSLS names the removed ACL")
			Expect(guestACLManifests(admin)).To(HaveLen(before), "the foreign ACL is gone")
			raw, err := json.Marshal(forged)
			Expect(err).NotTo(HaveOccurred())
			for _, e := range guestACLManifests(admin) {
				var got json.RawMessage
				_, err := admin.GetManifest(ctx, e.ID, &got)
				Expect(err).NotTo(HaveOccurred())
				Expect(string(got)).NotTo(MatchJSON(raw))
			}

			By("the guest, with its own credentials, reaching for the victim")
			attackerClient, err := loginAs(s, attacker, attackerPassword)
			Expect(err).NotTo(HaveOccurred())
			out, err := attackerClient.Run(ctx, "snapshot", "list", "--all")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).NotTo(ContainSubstring(victimDir), "the guest lists the victim's snapshots")
			out, err = attackerClient.Run(ctx, "manifest", "show", victimSnapshots[0])
			Expect(err).To(HaveOccurred(), "the guest read the victim's snapshot manifest: %s", out)
			out, err = attackerClient.Run(ctx, "snapshot", "delete", victimSnapshots[0], "--delete")
			Expect(err).To(HaveOccurred(), "the guest deleted the victim's snapshot: %s", out)
			out, err = attackerClient.Run(ctx, "server", "user", "set", victim, "--user-password=taken-over")
			Expect(err).To(HaveOccurred(), "the guest changed the victim's password: %s", out)
			out, err = attackerClient.Run(ctx, "server", "acl", "add", "--user="+attacker, "--target=type:snapshot", "--access=FULL")
			Expect(err).To(HaveOccurred(), "the guest added an ACL with kopia server acl add: %s", out)

			By("the victim keeping its login and its snapshot")
			_, err = loginAs(s, victim, "taken-over")
			Expect(err).To(refusedLogin())
			victimClient, err = loginAs(s, victim, victimPassword)
			Expect(err).NotTo(HaveOccurred())
			Expect(victimClient.SnapshotIDs(ctx, victimDir)).To(Equal(victimSnapshots))
			out, err = victimClient.Run(ctx, "snapshot", "restore", victimSnapshots[0], filepath.Join(GinkgoT().TempDir(), "restored"))
			Expect(err).NotTo(HaveOccurred(), out)
		})
	}
})

var _ = Describe("An append-only guest dating snapshots in the future", func() {
	It("does not make the server's retention delete its real snapshots", func() {
		selector := map[string]string{"security.test/retention": "future"}
		newNamespace("ret-backup", selector)
		newNamespace("ret-guests", selector)
		s := serveBSLS(bslsFor("ret-backup", "vault", selector, true))
		tenant := newTenant("ret-tenant", "ret-guests")
		createVM(tenant.Client, "ret-guests", "ledger", "ret-backup/vault")
		guest, password := waitProvisioned(s, "ret-guests", "ledger")
		c, err := loginAs(s, guest, password)
		Expect(err).NotTo(HaveOccurred())

		dir := guestSnapshot(c, "the ledger, monday\n")
		Expect(os.WriteFile(filepath.Join(dir, "data.txt"), []byte("the ledger, tuesday\n"), 0o600)).To(Succeed())
		out, err := c.Run(ctx, "snapshot", "create", dir)
		Expect(err).NotTo(HaveOccurred(), out)
		real, err := c.SnapshotIDs(ctx, dir)
		Expect(err).NotTo(HaveOccurred())
		Expect(real).To(HaveLen(2))

		By("ten empty snapshots of the same folder dated 2040, each followed by the server's retention")
		Expect(os.Remove(filepath.Join(dir, "data.txt"))).To(Succeed())
		for i := range 10 {
			at := time.Date(2040, 1, 1, i, 0, 0, 0, time.UTC).Format("2006-01-02 15:04:05 MST")
			out, err := c.Run(ctx, "snapshot", "create", dir, "--start-time="+at, "--end-time="+at)
			Expect(err).NotTo(HaveOccurred(), out)
		}

		all, err := c.SnapshotIDs(ctx, dir)
		Expect(err).NotTo(HaveOccurred())
		Expect(all).To(HaveLen(12), "every snapshot is still there")
		Expect(all).To(ContainElements(real), "the real snapshots survive")
		out, err = c.Run(ctx, "snapshot", "restore", real[1], filepath.Join(GinkgoT().TempDir(), "restored"))
		Expect(err).NotTo(HaveOccurred(), out)
	})
})
