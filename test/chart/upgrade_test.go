package chart

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// previousChart is the chart as released before its CRD moved from crds/
// into templates (helm package of charts/guestbackup at commit fb772b7).
const previousChart = "testdata/guestbackup-0.1.0.tgz"

// The upgrade docs/install.md describes, on a fresh cluster of the test bed:
// helm install of the previous chart, then helm upgrade to this one.
var _ = Describe("Upgrading from the previous chart version", Ordered, func() {
	const (
		namespace = "guestbackup-system"
		crdName   = "backupstoragelocationservers.guestbackup.io"
	)
	var (
		ctx context.Context
		api *testbed.APIServer
		run func(args ...string) (string, error)
	)

	BeforeAll(func() {
		ctx = context.Background()
		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{WithoutGuestbackupCRDs: true})
		config := writeKubeconfig(api)
		run = func(args ...string) (string, error) { return helm(append(args, "--kubeconfig", config)...) }
	})

	It("updates the CRD on helm upgrade, and keeps it on uninstall", func() {
		_, err := run("install", "guestbackup", previousChart, "-n", namespace, "--create-namespace")
		Expect(err).NotTo(HaveOccurred())
		old := &apiextensionsv1.CustomResourceDefinition{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Name: crdName}, old)).To(Succeed())
		Expect(old.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["access"].Properties).NotTo(HaveKey("clientIPBlocks"),
			"the previous chart's CRD predates access.clientIPBlocks")
		bsls := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: namespace},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
				Access:  v1alpha1.AccessSpec{ClientIPBlocks: []v1alpha1.IPBlock{{CIDR: "192.168.10.0/24"}}},
			},
		}
		Expect(api.Client.Create(ctx, bsls.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict"))).To(MatchError(ContainSubstring("clientIPBlocks")))

		// Once, from a chart whose CRD came from crds/ (which Helm never
		// tracks): the release takes the CRD over.
		docs, err := os.ReadFile(filepath.Join(repoRoot, "docs", "install.md"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(docs)).To(ContainSubstring("helm upgrade guestbackup charts/guestbackup -n guestbackup-system --reset-then-reuse-values --take-ownership"))
		_, err = run("upgrade", "guestbackup", chartDir, "-n", namespace, "--reset-then-reuse-values", "--take-ownership")
		Expect(err).NotTo(HaveOccurred())

		crd := &apiextensionsv1.CustomResourceDefinition{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Name: crdName}, crd)).To(Succeed())
		Expect(crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["access"].Properties).To(HaveKey("clientIPBlocks"))
		Expect(crd.Annotations).To(HaveKeyWithValue("meta.helm.sh/release-name", "guestbackup"))
		Expect(crd.Annotations).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"))
		// The API server serves the new field once the CRD is Established again.
		Eventually(func() error {
			return api.Client.Create(ctx, bsls.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict"))
		}).Should(Succeed())
		Expect(api.Client.Create(ctx, bsls)).To(Succeed())

		// Later upgrades need nothing more.
		_, err = run("upgrade", "guestbackup", chartDir, "-n", namespace, "--reset-then-reuse-values")
		Expect(err).NotTo(HaveOccurred())

		By("uninstalling: the CRD, and so every BSLS, stays")
		_, err = run("uninstall", "guestbackup", "-n", namespace)
		Expect(err).NotTo(HaveOccurred())
		Expect(api.Client.Get(ctx, client.ObjectKey{Name: crdName}, &apiextensionsv1.CustomResourceDefinition{})).To(Succeed())
		Expect(api.Client.Get(ctx, client.ObjectKeyFromObject(bsls), &v1alpha1.BackupStorageLocationServer{})).To(Succeed())

		By("installing again takes the kept CRD over")
		Expect(string(docs)).To(ContainSubstring("helm install guestbackup charts/guestbackup -n guestbackup-system --take-ownership"))
		_, err = run("install", "guestbackup", chartDir, "-n", namespace, "--take-ownership", "--set", "webhook.replicas=1")
		Expect(err).NotTo(HaveOccurred())
		Expect(api.Client.Get(ctx, client.ObjectKey{Name: crdName}, crd)).To(Succeed())
		Expect(crd.Labels).To(HaveKeyWithValue("helm.sh/chart", ContainSubstring("guestbackup-")))
	})
})
