package security

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// veleroReconciled bounds the controller's reaction to a write.
const veleroReconciled = 30 * time.Second

// A BSLS author is someone allowed to create BackupStorageLocationServers
// in one namespace, nothing more. Naming Velero's BackupStorageLocation
// would make the controller grant the author's server read access to
// Velero's storage credentials, in Velero's namespace, where the author has
// no rights at all. Only the Velero admin may give that.
var _ = Describe("A BSLS author naming a Velero BackupStorageLocation without the Velero admin's consent", Ordered, func() {
	const (
		veleroNS = "velero"
		authorNS = "x"
		bslName  = "default"
		secret   = "cloud-credentials"
		bslsName = "thief"
	)
	var (
		api    *testbed.APIServer
		author client.Client
		// asServer is the API as the BSLS's server pod's service account.
		asServer client.Client
		bsls     *v1alpha1.BackupStorageLocationServer
	)
	accessKey := func() client.ObjectKey {
		return client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(bsls)}
	}
	repositoryReady := func() *metav1.Condition {
		b := &v1alpha1.BackupStorageLocationServer{}
		if err := api.Client.Get(ctx, client.ObjectKeyFromObject(bsls), b); err != nil {
			return nil
		}
		return meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionRepositoryReady)
	}
	readsVeleroCredentials := func() error {
		return asServer.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: secret}, &corev1.Secret{})
	}
	setConsent := func(value string) {
		GinkgoHelper()
		Eventually(func() error {
			bsl := &unstructured.Unstructured{}
			bsl.SetGroupVersionKind(kopiaserver.VeleroBSL)
			if err := api.Client.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: bslName}, bsl); err != nil {
				return err
			}
			bsl.SetAnnotations(map[string]string{v1alpha1.AnnotationAllowedServers: value})
			return api.Client.Update(ctx, bsl)
		}).WithTimeout(10 * time.Second).Should(Succeed())
	}

	BeforeAll(func() {
		// The shared platform has no Velero: this cluster has, with the
		// controller's reconciler as cmd/controller runs it (its cache).
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{Velero: true})
		for _, ns := range []string{veleroNS, authorNS} {
			Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		}
		stop, err := testbed.RunManager(api, testbed.ManagerOptions{Logger: GinkgoLogr, Cache: controller.Cache()}, func(mgr ctrl.Manager) error {
			return (&kopiaserver.Reconciler{Image: "guestbackup:local", ControllerNamespace: "guestbackup-system"}).SetupWithManager(mgr)
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(stop)

		By("Velero's install: its credential Secret and BackupStorageLocation, no consent given")
		Expect(api.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: veleroNS},
			Data:       map[string][]byte{kopiaserver.VeleroDefaultCredentialsKey: []byte("[default]\naws_access_key_id=AKIAVELERO\naws_secret_access_key=velero-secret\n")},
		})).To(Succeed())
		bsl := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
			"provider":      "aws",
			"objectStorage": map[string]any{"bucket": "velero", "prefix": "cluster"},
			"config":        map[string]any{"region": "minio", "s3Url": "http://127.0.0.1:9000"},
		}}}
		bsl.SetGroupVersionKind(kopiaserver.VeleroBSL)
		bsl.SetNamespace(veleroNS)
		bsl.SetName(bslName)
		Expect(api.Client.Create(ctx, bsl)).To(Succeed())

		By("a BSLS author: BackupStorageLocationServers in namespace x, nothing else")
		Expect(api.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "bsls-author", Namespace: authorNS},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"backupstoragelocationservers"}, Verbs: []string{rbacv1.VerbAll}}},
		})).To(Succeed())
		Expect(api.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "bsls-author", Namespace: authorNS},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "bsls-author"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "author"}},
		})).To(Succeed())
		user, err := api.Env.AddUser(envtest.User{Name: "author", Groups: []string{"system:authenticated"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		author, err = client.New(user.Config(), client.Options{Scheme: api.Scheme})
		Expect(err).NotTo(HaveOccurred())

		bsls = &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: bslsName, Namespace: authorNS},
			Spec: v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
				BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: bslName, Namespace: veleroNS},
			}},
		}
		sa := "system:serviceaccount:" + authorNS + ":" + kopiaserver.ServiceAccountName(bsls)
		server, err := api.Env.AddUser(envtest.User{Name: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + authorNS, "system:authenticated"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		asServer, err = client.New(server.Config(), client.Options{Scheme: api.Scheme})
		Expect(err).NotTo(HaveOccurred())
	})

	It("grants nothing in Velero's namespace, and says who must set which annotation on which object", func() {
		Expect(author.Create(ctx, bsls)).To(Succeed())
		Eventually(repositoryReady).WithTimeout(veleroReconciled).Should(And(
			Not(BeNil()),
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kopiaserver.ReasonVeleroConsentRequired),
			HaveField("Message", And(
				ContainSubstring("Velero BackupStorageLocation velero/default"),
				ContainSubstring(v1alpha1.AnnotationAllowedServers),
				ContainSubstring("x/thief"),
			)),
		))
		// The condition is written by the reconcile that decided: nothing
		// was granted before it.
		Expect(api.Client.Get(ctx, accessKey(), &rbacv1.Role{})).To(Satisfy(apierrors.IsNotFound))
		Expect(api.Client.Get(ctx, accessKey(), &rbacv1.RoleBinding{})).To(Satisfy(apierrors.IsNotFound))
		Expect(readsVeleroCredentials()).To(Satisfy(apierrors.IsForbidden))
	})

	It("gives the server that one Secret once the Velero admin consents on the BackupStorageLocation", func() {
		setConsent("other/backup, x/thief")
		Eventually(readsVeleroCredentials).WithTimeout(veleroReconciled).Should(Succeed())
		Eventually(repositoryReady).WithTimeout(veleroReconciled).ShouldNot(HaveField("Reason", kopiaserver.ReasonVeleroConsentRequired))
	})

	It("takes the access back when the Velero admin withdraws consent", func() {
		setConsent("other/backup")
		Eventually(readsVeleroCredentials).WithTimeout(veleroReconciled).Should(Satisfy(apierrors.IsForbidden))
		Eventually(repositoryReady).WithTimeout(veleroReconciled).Should(HaveField("Reason", kopiaserver.ReasonVeleroConsentRequired))
		Expect(api.Client.Get(ctx, accessKey(), &rbacv1.Role{})).To(Satisfy(apierrors.IsNotFound))
	})
})
