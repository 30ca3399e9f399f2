package security

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// The generated repository password is the only key to every backup of a
// BSLS. Whoever deletes its Secret, by mistake or on purpose, must not get
// the controller to write a new password: a new one cannot open the
// repository, the server could not restart, and the Secret an admin would
// restore from backup would be overwritten.
var _ = Describe("Deleting the generated repository password of a repository that was opened", Ordered, func() {
	const ns = "lost-password"
	var (
		s        Server
		saved    *corev1.Secret
		username string
		password string
	)
	secretKey := func() client.ObjectKey {
		return client.ObjectKey{Namespace: ns, Name: kopiaserver.RepositoryPassword(s.BSLS).Name}
	}
	repositoryReady := func() *metav1.Condition {
		b := &v1alpha1.BackupStorageLocationServer{}
		if err := platform.API.Client.Get(ctx, client.ObjectKeyFromObject(s.BSLS), b); err != nil {
			return nil
		}
		return meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionRepositoryReady)
	}

	BeforeAll(func() {
		newNamespace(ns, nil)
		s = serveBSLS(&v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "vault", Namespace: ns},
			Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
		})
		Expect(s.BSLS.Status.RepositoryOpened).NotTo(BeNil(), "status records that the repository was opened")
		createVM(platform.API.Client, ns, "db", ns+"/vault")
		username, password = waitProvisioned(s, ns, "db")
		saved = &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, secretKey(), saved)).To(Succeed())
	})

	It("reports RepositoryPasswordLost naming the Secret to restore, and generates no new password", func() {
		Expect(platform.API.Client.Delete(ctx, saved.DeepCopy())).To(Succeed())
		Eventually(repositoryReady).WithTimeout(readyTimeout).Should(And(
			Not(BeNil()),
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kopiaserver.ReasonRepositoryPasswordLost),
			HaveField("Message", And(ContainSubstring("Restore Secret vault-repository"), ContainSubstring("namespace "+ns))),
		))
		// The reconcile that wrote the condition is the one that would have
		// generated a password, before writing it.
		Expect(platform.API.Client.Get(ctx, secretKey(), &corev1.Secret{})).To(Satisfy(apierrors.IsNotFound))
		Eventually(func() ([]string, error) {
			return platform.Events(ctx, ns, "BackupStorageLocationServer", s.BSLS.Name)
		}).WithTimeout(readyTimeout).Should(ContainElement(ContainSubstring(kopiaserver.ReasonRepositoryPasswordLost)))
	})

	It("keeps serving the guests meanwhile, and recovers when the admin restores the Secret", func() {
		_, err := loginAs(s, username, password)
		Expect(err).NotTo(HaveOccurred(), "the running server still opens the repository")

		restored := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: saved.Name, Namespace: saved.Namespace, Labels: saved.Labels, Annotations: saved.Annotations},
			Type:       saved.Type,
			Data:       saved.Data,
		}
		Expect(platform.API.Client.Create(ctx, restored)).To(Succeed())
		Eventually(repositoryReady).WithTimeout(readyTimeout).Should(HaveField("Status", metav1.ConditionTrue))
		got := &corev1.Secret{}
		Expect(platform.API.Client.Get(ctx, secretKey(), got)).To(Succeed())
		Expect(got.Data).To(Equal(saved.Data), "the restored password, not a generated one")
	})
})
