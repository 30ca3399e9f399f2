package security

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// The annotation and the Event reasons as an owner types and reads them
// (literals: the spec runs unchanged against code without the feature).
const (
	restoreFrom    = "guestbackup.io/restore-from"
	grantedReason  = "RestoreAccessGranted"
	revokedReason  = "RestoreAccessRevoked"
	refusedReason  = "RestoreAccessRefused"
	restoreFile    = "ledger.csv"
	restoreContent = "2026-11-24,invoice,42\n"
	// grantLimit is what the grant's Events say its end cannot take back.
	grantLimit = "files and folders whose IDs the guest read or noted under the grant stay readable by those IDs for as long as they are in the repository"
)

// A VM's owner restores a file of another VM of the namespace, one that
// is gone, through the annotation; the grant is read-only, ends with the
// annotation, and never reaches another namespace. The guests are real
// kopia clients with the credentials the webhook issued their VMs.
var _ = Describe("A file from a VM that is gone (guestbackup.io/restore-from)", Ordered, func() {
	var (
		srv                    Server
		owner, other           *Tenant
		newClient, spyClient   *testbed.KopiaClient
		newPassword, spyPasswd string
		oldDir, oldSnapshot    string
		// notedRoot is the root object ID of old's snapshot, as new's guest
		// notes it under the grant.
		notedRoot string
		// oldHeld and newHeld are sessions the guests hold open, as `kopia
		// mount` or any long command does: Kopia's own client, one gRPC
		// session for as long as it runs.
		oldHeld, newHeld repo.Repository
	)
	// readsOld is whether r's session reads old's snapshot manifest.
	readsOld := func(r *repo.Repository) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(ctx, heldCallTimeout)
			defer cancel()
			var m snapshot.Manifest
			_, err := (*r).GetManifest(ctx, manifest.ID(oldSnapshot), &m)
			return err
		}
	}
	// canRead is whether c lists old's snapshot and restores its file.
	canRead := func(c *testbed.KopiaClient) func() (string, error) {
		return func() (string, error) {
			ids, err := c.SnapshotIDs(ctx, "old@rf-a:"+oldDir)
			if err != nil || !strings.Contains(strings.Join(ids, " "), oldSnapshot) {
				return "not listed", err
			}
			target := filepath.Join(GinkgoT().TempDir(), "restored.csv")
			if out, err := c.Run(ctx, "restore", oldSnapshot+"/"+restoreFile, target); err != nil {
				return out, err
			}
			data, err := os.ReadFile(target)
			return string(data), err
		}
	}
	events := func(c client.Client, namespace, vm, reason string) func() []string {
		return func() []string {
			list := &corev1.EventList{}
			if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
				return nil
			}
			var out []string
			for _, e := range list.Items {
				if e.InvolvedObject.Kind == "VirtualMachine" && e.InvolvedObject.Name == vm && e.Reason == reason {
					out = append(out, e.Type+" "+e.Message)
				}
			}
			return out
		}
	}
	annotate := func(t *Tenant, vm, value string) {
		GinkgoHelper()
		v := &kubevirtv1.VirtualMachine{}
		Expect(t.Client.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: vm}, v)).To(Succeed())
		patch := client.MergeFrom(v.DeepCopy())
		if value == "" {
			delete(v.Annotations, restoreFrom)
		} else {
			v.Annotations[restoreFrom] = value
		}
		Expect(t.Client.Patch(ctx, v, patch)).To(Succeed(), "the owner sets %s=%q", restoreFrom, value)
	}

	AfterAll(func() {
		if newHeld != nil {
			_ = newHeld.Close(context.Background())
		}
	})

	BeforeAll(func() {
		allowed := map[string]string{"restore-spec": "allowed"}
		newNamespace("rf-srv", nil)
		newNamespace("rf-a", allowed)
		newNamespace("rf-b", allowed)
		srv = serveBSLS(bslsFor("rf-srv", "main", allowed, false))
		owner = newTenant("rf-owner", "rf-a")
		other = newTenant("rf-other", "rf-b")
		for _, vm := range []string{"old", "new"} {
			createVM(owner.Client, "rf-a", vm, "rf-srv/main")
		}
		createVM(other.Client, "rf-b", "spy", "rf-srv/main")
		oldUser, oldPassword := waitProvisioned(srv, "rf-a", "old")
		var newUser, spyUser string
		newUser, newPassword = waitProvisioned(srv, "rf-a", "new")
		spyUser, spyPasswd = waitProvisioned(srv, "rf-b", "spy")
		var err error

		By("old's guest backing up a file")
		oldClient, err := loginAs(srv, oldUser, oldPassword)
		Expect(err).NotTo(HaveOccurred())
		oldDir = GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(oldDir, restoreFile), []byte(restoreContent), 0o600)).To(Succeed())
		out, err := oldClient.Run(ctx, "snapshot", "create", oldDir)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := oldClient.SnapshotIDs(ctx, oldDir)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		oldSnapshot = ids[0]
		oldHeld = guestOpen(srv, oldUser, oldPassword)
		Expect(readsOld(&oldHeld)()).To(Succeed(), "old's guest holds a session on its own snapshots")

		newClient, err = loginAs(srv, newUser, newPassword)
		Expect(err).NotTo(HaveOccurred())
		spyClient, err = loginAs(srv, spyUser, spyPasswd)
		Expect(err).NotTo(HaveOccurred())
	})

	It("shows the other VM's snapshots to no guest before the grant", func() {
		for _, c := range []*testbed.KopiaClient{newClient, spyClient} {
			out, err := canRead(c)()
			Expect(out).NotTo(Equal(restoreContent), "a guest without a grant read old's file: %v", err)
			out, err = c.Run(ctx, "restore", oldSnapshot+"/"+restoreFile, filepath.Join(GinkgoT().TempDir(), "x"))
			Expect(err).To(HaveOccurred(), "a guest without a grant restored old's file: %s", out)
		}
	})

	It("grants the VM of the annotation read access, said on both VMs", func() {
		annotate(owner, "new", "old")
		Eventually(canRead(newClient)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(Equal(restoreContent),
			"new's guest lists and restores old's file")
		Eventually(events(owner.Client, "rf-a", "new", grantedReason)).WithTimeout(guestACLSyncTimeout).Should(ConsistOf(
			And(HavePrefix("Normal This VM's guest may read the snapshots of old@rf-a"), ContainSubstring("read-only"), ContainSubstring(grantLimit))))
		Eventually(events(owner.Client, "rf-a", "old", grantedReason)).WithTimeout(guestACLSyncTimeout).Should(ConsistOf(
			And(HavePrefix("Normal The guest of VirtualMachine new may read this VM's snapshots (old@rf-a)"), ContainSubstring(grantLimit))))
		out, err := newClient.Run(ctx, "snapshot", "list", "old@rf-a:"+oldDir, "--json")
		Expect(err).NotTo(HaveOccurred(), out)
		var listed []struct {
			RootEntry struct {
				Obj string `json:"obj"`
			} `json:"rootEntry"`
		}
		Expect(json.Unmarshal([]byte(out), &listed)).To(Succeed(), out)
		Expect(listed).To(HaveLen(1))
		notedRoot = listed[0].RootEntry.Obj
		Expect(notedRoot).NotTo(BeEmpty())
		// Held across the specs that follow, until the container ends.
		newHeld = guestSession(srv, "new@rf-a", newPassword)
		Expect(readsOld(&newHeld)()).To(Succeed(), "new's guest holds a session open under the grant")
	})

	It("still restores the file once the VM is gone", func() {
		old := &kubevirtv1.VirtualMachine{}
		Expect(owner.Client.Get(ctx, types.NamespacedName{Namespace: "rf-a", Name: "old"}, old)).To(Succeed())
		Expect(owner.Client.Delete(ctx, old)).To(Succeed())
		Eventually(func() string { return usersOf(srv.BSLS, "old@rf-a") }).WithTimeout(guestACLSyncTimeout).ShouldNot(ContainSubstring("old@rf-a "),
			"old's user is revoked with its VM")
		guestNudgeUserSync(srv.BSLS, "old deleted")
		Consistently(canRead(newClient)).WithTimeout(5 * time.Second).WithPolling(time.Second).Should(Equal(restoreContent))
	})

	It("ends the session the deleted VM's guest held open", func() {
		Eventually(readsOld(&oldHeld)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(),
			"a session old's guest opened before its VM was deleted still reads old's snapshots")
		Eventually(guestBSLSEvents(srv.BSLS)).WithTimeout(guestACLSyncTimeout).Should(ContainElement(And(
			HavePrefix("Normal SessionsEnded: "), ContainSubstring("old@rf-a: 1 (user removed)"))))
		Expect(readsOld(&newHeld)()).To(Succeed(), "the grantee's session is not old's: it goes on")
	})

	It("lets the grantee neither delete nor write the other identity's snapshots", func() {
		out, err := newClient.Run(ctx, "snapshot", "delete", oldSnapshot, "--delete")
		Expect(err).To(HaveOccurred(), "the grantee deleted old's snapshot: %s", out)
		r := guestOpen(srv, "new@rf-a", newPassword)
		var m snapshot.Manifest
		_, err = r.GetManifest(ctx, manifest.ID(oldSnapshot), &m)
		Expect(err).NotTo(HaveOccurred(), "the grant reads old's snapshot manifest through Kopia's own client")
		err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "attack"}, func(ctx context.Context, w repo.RepositoryWriter) error {
			return w.DeleteManifest(ctx, manifest.ID(oldSnapshot))
		})
		Expect(err).To(HaveOccurred(), "the grantee deleted old's snapshot manifest")
		forged := m
		forged.Description = "forged by the grantee"
		err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "attack"}, func(ctx context.Context, w repo.RepositoryWriter) error {
			_, err := snapshot.SaveSnapshot(ctx, w, &forged)
			return err
		})
		Expect(err).To(HaveOccurred(), "the grantee wrote a snapshot as old")
		ids, err := guestAdminSnapshots(srv, "old@rf-a:"+oldDir)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(ConsistOf(oldSnapshot), "old's snapshots are as they were")
	})

	It("never reaches another namespace", func() {
		By("a VM of another namespace naming old: its own namespace's old, which has nothing")
		annotate(other, "spy", "old")
		Eventually(events(other.Client, "rf-b", "spy", grantedReason)).WithTimeout(guestACLSyncTimeout).Should(ConsistOf(
			HavePrefix("Normal This VM's guest may read the snapshots of old@rf-b")))
		Consistently(canRead(spyClient)).WithTimeout(5 * time.Second).WithPolling(time.Second).ShouldNot(Equal(restoreContent))

		By("naming old's namespace: refused")
		for _, value := range []string{"rf-a/old", "old@rf-a"} {
			annotate(other, "spy", value)
			Eventually(events(other.Client, "rf-b", "spy", refusedReason)).WithTimeout(guestACLSyncTimeout).Should(ContainElement(
				And(HavePrefix("Warning annotation "+restoreFrom+"=\""+value+"\" grants nothing"), ContainSubstring("another namespace can never be named"))))
		}
		Eventually(events(other.Client, "rf-b", "spy", revokedReason)).WithTimeout(guestACLSyncTimeout).Should(HaveLen(1), "the grant of old@rf-b is revoked")

		By("saying so once per value, however often the server is reconciled")
		createVM(other.Client, "rf-b", "later", "rf-srv/main")
		waitProvisioned(srv, "rf-b", "later") // reconciled since, at least once
		list := &corev1.EventList{}
		Expect(other.Client.List(ctx, list, client.InNamespace("rf-b"))).To(Succeed())
		for _, e := range list.Items {
			if e.InvolvedObject.Name == "spy" && e.Reason == refusedReason {
				Expect(e.Count).To(BeNumerically("<=", 1), "%s recorded %d times: %s", refusedReason, e.Count, e.Message)
			}
		}
		out, err := canRead(spyClient)()
		Expect(out).NotTo(Equal(restoreContent), "the spy read old's file: %v", err)
		out, err = spyClient.Run(ctx, "restore", oldSnapshot+"/"+restoreFile, filepath.Join(GinkgoT().TempDir(), "x"))
		Expect(err).To(HaveOccurred(), "the spy restored old's file by its snapshot ID: %s", out)
	})

	It("ends when the annotation is removed", func() {
		annotate(owner, "new", "")
		Eventually(func() error {
			_, err := newClient.Run(ctx, "restore", oldSnapshot+"/"+restoreFile, filepath.Join(GinkgoT().TempDir(), "x"))
			return err
		}).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(), "new's guest still restores old's file")
		Expect(canRead(newClient)()).NotTo(Equal(restoreContent))
		Eventually(events(owner.Client, "rf-a", "new", revokedReason)).WithTimeout(guestACLSyncTimeout).Should(ConsistOf(
			And(HavePrefix("Normal This VM's guest may no longer read the snapshots of old@rf-a"), ContainSubstring(grantLimit))))
	})

	It("leaves readable, as its Events say, what the grantee noted by ID under the grant", func() {
		// Kopia serves an object to any user who names its ID: the limit
		// the Events state, shown with a fresh client of the grantee.
		fresh, err := loginAs(srv, "new@rf-a", newPassword)
		Expect(err).NotTo(HaveOccurred())
		target := filepath.Join(GinkgoT().TempDir(), "by-id.csv")
		out, err := fresh.Run(ctx, "restore", notedRoot+"/"+restoreFile, target)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(os.ReadFile(target)).To(BeEquivalentTo(restoreContent))
		Expect(canRead(fresh)()).NotTo(Equal(restoreContent), "the snapshots themselves are no longer listed nor read")
	})

	It("ends with it the session the grantee opened under the grant", func() {
		Eventually(readsOld(&newHeld)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(),
			"a session new's guest opened under the grant still reads old's snapshots after the annotation is gone")
		Eventually(guestBSLSEvents(srv.BSLS)).WithTimeout(guestACLSyncTimeout).Should(ContainElement(And(
			HavePrefix("Normal SessionsEnded: "), ContainSubstring("new@rf-a: 1 (restore grant of old@rf-a revoked)"))))
		out, err := newClient.Run(ctx, "snapshot", "list", "--all")
		Expect(err).NotTo(HaveOccurred(), "new's guest keeps its own access: %s", out)
	})
})

// guestAdminSnapshots lists the snapshots of a source as the holder of the
// repository password sees them.
func guestAdminSnapshots(s Server, source string) ([]string, error) {
	r := guestAdminOpen(s)
	Expect(r.Refresh(ctx)).To(Succeed())
	src, err := snapshot.ParseSourceInfo(source, "", "")
	if err != nil {
		return nil, err
	}
	ids, err := snapshot.ListSnapshotManifests(ctx, r, &src, nil)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(id)
	}
	return out, err
}
