package security

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// serverPodAs is a clientset that impersonates the server pod's service
// account of BSLS name in namespace, so the API server authorizes every
// request against the Role the controller wrote for it.
func serverPodAs(namespace, name string) kubernetes.Interface {
	GinkgoHelper()
	cfg := rest.CopyConfig(platform.API.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + name + "-server",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	return cs
}

var _ = Describe("A server pod's service account", func() {
	It("reads its own users Secrets by name and no other Secret", func() {
		const ns = "sa-backup"
		newNamespace(ns, map[string]string{"security.test/sa": "x"})
		s := serveBSLS(bslsFor(ns, "one", map[string]string{"security.test/sa": "x"}, false))
		// Another BSLS in the same namespace, and an S3 key the admin keeps
		// there: neither is the server pod's business.
		other := bslsFor(ns, "two", map[string]string{"security.test/sa": "x"}, false)
		Expect(platform.API.Client.Create(ctx, other)).To(Succeed())
		Expect(platform.API.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "s3-keys", Namespace: ns},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret"},
		})).To(Succeed())
		Eventually(func() error {
			return platform.API.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kopiaserver.RepositoryPassword(other).Name}, &corev1.Secret{})
		}).WithTimeout(30*time.Second).Should(Succeed(), "the controller generated the other BSLS's repository password")

		own := map[string]bool{}
		for i := range userset.Shards {
			own[userset.SecretName(s.BSLS.Name, i)] = true
		}
		sa := serverPodAs(ns, s.BSLS.Name).CoreV1().Secrets(ns)

		By("listing or watching the namespace's Secrets")
		_, err := sa.List(ctx, metav1.ListOptions{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "list Secrets of %s: %v", ns, err)
		_, err = sa.Watch(ctx, metav1.ListOptions{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "watch Secrets of %s: %v", ns, err)

		By("getting, listing or watching by name each Secret that is not its users Secrets")
		all := &corev1.SecretList{}
		Expect(platform.API.Client.List(ctx, all)).To(Succeed())
		names := []string{kopiaserver.RepositoryPassword(s.BSLS).Name, kopiaserver.ControlSecretName(s.BSLS), kopiaserver.TLSSecretName(s.BSLS), kopiaserver.RepositoryPassword(other).Name, "s3-keys"}
		for _, secret := range all.Items {
			if secret.Namespace == ns && !own[secret.Name] {
				names = append(names, secret.Name)
			}
		}
		for _, name := range names {
			_, err := sa.Get(ctx, name, metav1.GetOptions{})
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "get Secret %s/%s: %v", ns, name, err)
			byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
			_, err = sa.List(ctx, byName)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "list Secret %s/%s by name: %v", ns, name, err)
		}
		_, err = serverPodAs(ns, s.BSLS.Name).CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "list Secrets of another namespace: %v", err)

		By("reading its users Secrets by name, as user sync does")
		for name := range own {
			_, err := sa.Get(ctx, name, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred(), "get users Secret %s", name)
			byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
			list, err := sa.List(ctx, byName)
			Expect(err).NotTo(HaveOccurred(), "list users Secret %s by name", name)
			Expect(list.Items).To(HaveLen(1))
			byName.ResourceVersion = list.ResourceVersion
			w, err := sa.Watch(ctx, byName)
			Expect(err).NotTo(HaveOccurred(), "watch users Secret %s by name", name)
			w.Stop()
		}
	})
})
