package security

import (
	"context"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// heldCallTimeout bounds one request on a held session. A session the
// server ended reconnects; Kopia's client retries one the server refuses
// for about two minutes before it says "access denied", so a request that
// does not succeed within this is refused.
const heldCallTimeout = 20 * time.Second

// heldReads sends one request on r's session: what a mounted snapshot or a
// long restore does again and again.
func heldReads(r repo.Repository) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(ctx, heldCallTimeout)
		defer cancel()
		_, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: "snapshot"})
		return err
	}
}

// A VM's password leaks; its owner rotates it (guestbackup.io/rotate).
// Whoever holds the old password loses the repository, a session opened
// before the rotation included: Kopia's server authenticates and authorizes
// a session once, when it opens, so the server pod ends it.
var _ = Describe("A session held open with a password that is then rotated", Ordered, func() {
	const ns = "rotated-session"
	var (
		s                     Server
		username, oldPassword string
		// held is the thief's session: Kopia's own client, one gRPC
		// session for as long as it runs.
		held repo.Repository
	)
	BeforeAll(func() {
		newNamespace(ns, nil)
		s = serveBSLS(&v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: ns},
			Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
		})
		createVM(platform.API.Client, ns, "db", ns+"/main")
		username, oldPassword = waitProvisioned(s, ns, "db")
		held = guestOpen(s, username, oldPassword)
		Expect(heldReads(held)()).To(Succeed(), "the holder of db's password holds a session")
	})

	It("ends the session opened with the old password; the new one logs in", func() {
		vm := &kubevirtv1.VirtualMachine{}
		Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "db"}, vm)).To(Succeed())
		patch := client.MergeFrom(vm.DeepCopy())
		vm.Annotations[v1alpha1.AnnotationRotate] = "leaked"
		Expect(platform.API.Client.Patch(ctx, vm, patch)).To(Succeed(), "the owner rotates db's password")
		var newPassword string
		Eventually(func() string {
			secret := &corev1.Secret{}
			Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.CredentialSecretName("db")}, secret)).To(Succeed())
			newPassword = string(secret.Data[v1alpha1.SecretKeyPassword])
			return newPassword
		}).WithTimeout(provisionTimeout).ShouldNot(Equal(oldPassword))

		Eventually(heldReads(held)).WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(HaveOccurred(),
			"a session opened with db's old password still reads the repository after the rotation")
		Eventually(guestBSLSEvents(s.BSLS)).WithTimeout(guestACLSyncTimeout).Should(ContainElement(And(
			HavePrefix("Normal SessionsEnded: "), ContainSubstring(username+": 1 (password changed)"))))
		_, err := loginAs(s, username, oldPassword)
		Expect(err).To(refusedLogin(), "the old password opens no new session either")
		Eventually(func() error { _, err := loginAs(s, username, newPassword); return err }).
			WithTimeout(guestACLSyncTimeout).WithPolling(2*time.Second).Should(Succeed(), "db's guest logs in with its new password")
	})
})
