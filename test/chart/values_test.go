package chart

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/requests"
)

// The values operators set beside the defaults (testdata/operator.yaml):
// each lands where it means something, and the API server accepts the result.
var _ = Describe("The chart with an operator's values", Ordered, func() {
	const namespace = "gb-operator"
	var r rendered

	BeforeAll(func() {
		Expect(apiServer.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})).To(Succeed())
		r = render(namespace, "operator.yaml")
	})

	It("renders objects the API server accepts (server-side dry-run, strict field validation)", func() {
		for _, o := range r.objects {
			if o.GetKind() == "CustomResourceDefinition" {
				continue
			}
			err := apiServer.Client.Create(context.Background(), o.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict"))
			Expect(err).NotTo(HaveOccurred(), "%s %s", o.GetKind(), o.GetName())
		}
	})

	It("labels every object with commonLabels, never over the chart's own", func() {
		for _, o := range r.objects {
			Expect(o.GetLabels()).To(HaveKeyWithValue("team", "platform"), "%s %s", o.GetKind(), o.GetName())
			Expect(o.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/name", "guestbackup"), "%s %s", o.GetKind(), o.GetName())
		}
		for _, name := range []string{release + "-controller", release + "-webhook"} {
			d := as[appsv1.Deployment](r.find("Deployment", name))
			Expect(d.Spec.Template.Labels).To(HaveKeyWithValue("team", "platform"))
			for k, v := range d.Spec.Selector.MatchLabels {
				Expect(d.Spec.Template.Labels).To(HaveKeyWithValue(k, v), "the selector's labels win")
			}
		}
	})

	It("gives the controller its flags, environment, identity, scheduling and security contexts", func() {
		d := as[appsv1.Deployment](r.find("Deployment", release+"-controller"))
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		Expect(c.Args).To(ContainElement("--guest-activity-interval=30s"))
		// After the chart's own, so that the binary's flag parsing takes them.
		Expect(c.Args[len(c.Args)-2:]).To(Equal([]string{"--zap-log-level=debug", "--hash-concurrency=4"}))
		Expect(c.Env[0].Name).To(Equal("POD_NAMESPACE"))
		Expect(c.Env[1:]).To(Equal([]corev1.EnvVar{
			{Name: "HTTPS_PROXY", Value: "http://proxy.example.com:3128"},
			{Name: "NO_PROXY", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "proxy"}, Key: "no-proxy"}}},
		}))
		// Merged over the restricted defaults, which stay.
		Expect(spec.SecurityContext).To(Equal(&corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532), FSGroup: ptr.To[int64](65532),
		}))
		Expect(c.SecurityContext.RunAsUser).To(Equal(ptr.To[int64](65532)))
		Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)))
		Expect(c.SecurityContext.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
		Expect(spec.NodeSelector).To(Equal(map[string]string{"kubernetes.io/os": "linux"}))
		Expect(spec.Tolerations).To(HaveLen(1))
		Expect(spec.Affinity.NodeAffinity).NotTo(BeNil())
		Expect(spec.TopologySpreadConstraints).To(HaveLen(1))
		Expect(spec.PriorityClassName).To(Equal("system-cluster-critical"))
		Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceEphemeralStorage))
		Expect(d.Spec.Template.Annotations).To(HaveKeyWithValue("prometheus.io/scrape", "true"))
		Expect(d.Spec.Template.Labels).To(HaveKeyWithValue("tier", "control"))

		sa := r.find("ServiceAccount", release+"-controller")
		Expect(sa.GetAnnotations()).To(Equal(map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/guestbackup"}))
	})

	It("runs one webhook replica without a PodDisruptionBudget, with its own extras", func() {
		d := as[appsv1.Deployment](r.find("Deployment", release+"-webhook"))
		Expect(*d.Spec.Replicas).To(BeEquivalentTo(1))
		Expect(r.ofKind("PodDisruptionBudget")).To(BeEmpty(), "a drain must be free to evict the only replica")
		c := d.Spec.Template.Spec.Containers[0]
		Expect(c.Args[len(c.Args)-1]).To(Equal("--zap-log-level=2"))
		Expect(c.Env).To(Equal([]corev1.EnvVar{{Name: "GOMAXPROCS", Value: "2"}}))
		Expect(d.Spec.Template.Spec.SecurityContext.FSGroup).To(Equal(ptr.To[int64](65532)))
		Expect(d.Spec.Template.Spec.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
		Expect(r.find("ServiceAccount", release+"-webhook").GetAnnotations()).To(HaveKey("iam.gke.io/gcp-service-account"))
		Expect(r.find("ServiceAccount", release+"-controller").GetAnnotations()).NotTo(HaveKey("iam.gke.io/gcp-service-account"))
	})

	It("keeps a budget below the replicas from 2 replicas on", func() {
		_, err := helm("template", release, chartDir, "--set", "webhook.replicas=2", "--set", "webhook.podDisruptionBudget.minAvailable=2")
		Expect(err).To(MatchError(ContainSubstring("must be lower than webhook.replicas")))
		// With one replica the budget is not rendered, so it cannot block.
		_, err = helm("template", release, chartDir, "--set", "webhook.replicas=1", "--set", "webhook.podDisruptionBudget.minAvailable=1")
		Expect(err).NotTo(HaveOccurred())
	})
})

var _ = Describe("The chart's CRDs", func() {
	It("renders guestbackup's generated CRDs as templates, kept on uninstall", func() {
		r := render("gb-crds", "requests.yaml")
		crds := r.ofKind("CustomResourceDefinition")
		files, err := filepath.Glob(filepath.Join(chartDir, "files", "crds", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(files).NotTo(BeEmpty())
		Expect(crds).To(HaveLen(len(files)))
		// The requests' CRDs are alpha: only requests.enabled installs them.
		var names []string
		for _, crd := range render("gb-crds", "default.yaml").ofKind("CustomResourceDefinition") {
			names = append(names, crd.GetName())
		}
		Expect(names).To(HaveLen(len(files) - len(requests.Resources)))
		for _, resource := range requests.Resources {
			Expect(names).NotTo(ContainElement(resource + "." + v1alpha1.GroupVersion.Group))
			r.find("CustomResourceDefinition", resource+"."+v1alpha1.GroupVersion.Group)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			Expect(err).NotTo(HaveOccurred())
			want := &apiextensionsv1.CustomResourceDefinition{}
			Expect(yaml.UnmarshalStrict(data, want)).To(Succeed())
			got := as[apiextensionsv1.CustomResourceDefinition](r.find("CustomResourceDefinition", want.Name))
			Expect(got.Spec).To(Equal(want.Spec), "the template renders controller-gen's CRD unchanged")
			Expect(got.Annotations).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"))
			Expect(got.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "Helm"))
			// The test bed's API server serves this very file: an update
			// with it is accepted.
			served := &apiextensionsv1.CustomResourceDefinition{}
			Expect(apiServer.Client.Get(context.Background(), client.ObjectKey{Name: want.Name}, served)).To(Succeed())
			got.ResourceVersion = served.ResourceVersion
			Expect(apiServer.Client.Update(context.Background(), got, client.DryRunAll, client.FieldValidation("Strict"))).To(Succeed())
		}

		out, err := helm("template", release, chartDir, "--set", "crds.install=false")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).NotTo(ContainSubstring("kind: CustomResourceDefinition"))
		out, err = helm("template", release, chartDir, "--set", "crds.keep=false")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring("kind: CustomResourceDefinition"))
		Expect(out).NotTo(ContainSubstring("helm.sh/resource-policy"))
	})

	It("is never in crds/, which helm upgrade skips", func() {
		_, err := os.Stat(filepath.Join(chartDir, "crds"))
		Expect(os.IsNotExist(err)).To(BeTrue(), "charts/guestbackup/crds exists: Helm would install it once and never upgrade it")
	})
})
