package chart

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/requests"
)

const release = "guestbackup"

// valueSet is one way admins install the chart, and what it must produce.
type valueSet struct {
	name string
	// file is the values file under testdata/.
	file string
	// namespace to install into; each value set has its own.
	namespace string
	// certManager: the webhook's TLS comes from cert-manager.
	certManager bool
	// requests: requests.enabled, the alpha GuestSnapshot and GuestRestore.
	requests bool
}

var valueSets = []valueSet{
	{name: "default", file: "default.yaml", namespace: "gb-default", certManager: true},
	{name: "cert-manager disabled", file: "no-cert-manager.yaml", namespace: "gb-no-cert-manager"},
	{name: "OpenShift-like", file: "openshift.yaml", namespace: "gb-openshift", certManager: true},
	{name: "requests enabled", file: "requests.yaml", namespace: "gb-requests", requests: true},
}

// rendered is the chart's output, decoded.
type rendered struct {
	text    string
	objects []*unstructured.Unstructured
}

// find returns the rendered object of that kind and name, or fails.
func (r rendered) find(kind, name string) *unstructured.Unstructured {
	GinkgoHelper()
	for _, o := range r.objects {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	Fail("the chart renders no " + kind + " " + name)
	return nil
}

func (r rendered) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objects {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// as converts a rendered object into its typed form.
func as[T any](o *unstructured.Unstructured) *T {
	GinkgoHelper()
	out := new(T)
	Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out)).To(Succeed())
	return out
}

func render(namespace, valuesFile string) rendered {
	GinkgoHelper()
	return renderRelease(release, namespace, valuesFile)
}

// renderRelease renders the chart as another release: its cluster-scoped
// objects (ClusterRoles, the webhook configuration) have other names.
func renderRelease(releaseName, namespace, valuesFile string) rendered {
	GinkgoHelper()
	out, err := helm("template", releaseName, chartDir, "--namespace", namespace, "--values", filepath.Join("testdata", valuesFile))
	Expect(err).NotTo(HaveOccurred())
	return rendered{text: out, objects: decode(out)}
}

func decode(manifest string) []*unstructured.Unstructured {
	GinkgoHelper()
	var objs []*unstructured.Unstructured
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		Expect(err).NotTo(HaveOccurred())
		obj := map[string]any{}
		Expect(yaml.Unmarshal(doc, &obj)).To(Succeed())
		if len(obj) == 0 { // a document of comments only
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: obj})
	}
}

// containers lists every container of a pod spec, init containers included.
func containers(spec *corev1.PodSpec) []corev1.Container {
	return slices.Concat(spec.InitContainers, spec.Containers)
}

func argValue(args []string, flag string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

var _ = Describe("The chart", func() {
	It("lints strictly with each value set", func() {
		for _, set := range append(slices.Clone(valueSets), valueSet{name: "operator", file: "operator.yaml"}) {
			out, err := helm("lint", "--strict", chartDir, "--values", filepath.Join("testdata", set.file))
			Expect(err).NotTo(HaveOccurred(), set.name)
			Expect(out).To(ContainSubstring("0 chart(s) failed"))
		}
	})

	It("refuses values its schema does not describe", func() {
		_, err := helm("template", release, chartDir, "--set", "webhook.replicas=0")
		Expect(err).To(MatchError(ContainSubstring("/webhook/replicas")))
		_, err = helm("template", release, chartDir, "--set", "controller.runAsUser=1000")
		Expect(err).To(MatchError(ContainSubstring("runAsUser")))
		// Typos in guestbackup's own keys, also below the new values.
		for typo, want := range map[string]string{
			"controller.extraArg={--x}":             "at '/controller': additional properties 'extraArg' not allowed",
			"webhook.serviceAccount.annotation.a=b": "at '/webhook/serviceAccount': additional properties 'annotation' not allowed",
			"crds.instal=true":                      "at '/crds': additional properties 'instal' not allowed",
			"commonLabel.a=b":                       "additional properties 'commonLabel' not allowed",
			"controller.extraEnv[0].name=A,controller.extraEnv[0].vaule=b": "at '/controller/extraEnv/0': additional properties 'vaule' not allowed",
		} {
			_, err = helm("template", release, chartDir, "--set", typo)
			Expect(err).To(MatchError(ContainSubstring(want)), typo)
		}
		_, err = helm("template", release, chartDir, "--set", "controller.guestActivityInterval=every minute")
		Expect(err).To(MatchError(ContainSubstring("/controller/guestActivityInterval")))
		// A budget that no drain could ever satisfy.
		_, err = helm("template", release, chartDir, "--set", "webhook.podDisruptionBudget.minAvailable=2")
		Expect(err).To(MatchError(ContainSubstring("must be lower than webhook.replicas")))
	})

	It("describes every value in values.schema.json", func() {
		var schema map[string]any
		data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
		Expect(err).NotTo(HaveOccurred())
		Expect(json.Unmarshal(data, &schema)).To(Succeed())
		values := map[string]any{}
		data, err = os.ReadFile(filepath.Join(chartDir, "values.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(yaml.Unmarshal(data, &values)).To(Succeed())
		describesAll("", schema, values)
	})

	It("tells the admin the next two steps, with a BSLS the API server accepts", func() {
		ctx := context.Background()
		const namespace = "gb-notes"
		Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})).To(Succeed())
		for _, values := range []string{"default.yaml", "no-cert-manager.yaml"} {
			// This API server serves the CRD already, as envtest installed
			// it (not Helm): the chart leaves it alone, as with GitOps.
			out, err := helm("install", release, chartDir, "--namespace", namespace, "--values", filepath.Join("testdata", values),
				"--set", "crds.install=false", "--dry-run=server", "--kubeconfig", kubeconfig)
			Expect(err).NotTo(HaveOccurred())
			_, notes, ok := strings.Cut(out, "\nNOTES:\n")
			Expect(ok).To(BeTrue(), "helm prints the NOTES")
			Expect(notes).To(ContainSubstring("1. As cluster admin, create a BackupStorageLocationServer"))
			Expect(notes).To(ContainSubstring("2. As VM owner"))
			Expect(notes).To(ContainSubstring("kubectl annotate vm -n <vm-namespace> <vm> guestbackup.io/server=backup/main"))

			// The example between the heredoc's markers, as the admin pastes it.
			_, example, ok := strings.Cut(notes, "<<'YAML'\n")
			Expect(ok).To(BeTrue())
			example, _, ok = strings.Cut(example, "\n   YAML\n")
			Expect(ok).To(BeTrue())
			objs := decode(strings.ReplaceAll("\n"+example, "\n   ", "\n"))
			Expect(objs).To(HaveLen(1))
			Expect(objs[0].GetKind()).To(Equal("BackupStorageLocationServer"))
			// Its namespace, as the example's first command creates it.
			if err := apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objs[0].GetNamespace()}}); !apierrors.IsAlreadyExists(err) {
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(apiServer.Client.Create(ctx, objs[0], client.DryRunAll, client.FieldValidation("Strict"))).To(Succeed())
		}
	})
})

var _ = Describe("The chart rendered", func() {
	for _, set := range valueSets {
		Describe("with "+set.name+" values", Ordered, func() {
			// The release namespace enforces the restricted Pod Security
			// Standard.
			namespace := set.namespace
			webhookName := release + "-webhook"
			var (
				ctx context.Context
				r   rendered
			)

			BeforeAll(func() {
				ctx = context.Background()
				for _, ns := range []*corev1.Namespace{
					{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}},
					// cert-manager's cluster resource namespace, where the
					// servers' CA Certificate goes.
					{ObjectMeta: metav1.ObjectMeta{Name: "cert-manager"}},
				} {
					if err := apiServer.Client.Create(ctx, ns); !apierrors.IsAlreadyExists(err) {
						Expect(err).NotTo(HaveOccurred())
					}
				}
				r = render(namespace, set.file)
				Expect(r.objects).NotTo(BeEmpty())
			})

			It("renders objects the API server accepts (server-side dry-run, strict field validation)", func() {
				for _, o := range r.objects {
					if o.GetKind() == "CustomResourceDefinition" {
						continue // served already: see "renders guestbackup's CRDs"
					}
					obj := o.DeepCopy()
					err := apiServer.Client.Create(ctx, obj, client.DryRunAll, client.FieldValidation("Strict"))
					Expect(err).NotTo(HaveOccurred(), "%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
				}
				Expect(r.ofKind("Deployment")).To(HaveLen(2))
				if set.requests {
					Expect(r.ofKind("ClusterRole")).To(HaveLen(9), "the controller's, the webhook's, the server pods' maintenance election, the namespace readers' view, the BackupClients' edit and view, the requests' edit and view, and the controller's for them")
				} else {
					Expect(r.ofKind("ClusterRole")).To(HaveLen(6), "the controller's, the webhook's, the server pods' maintenance election, the namespace readers' view and the BackupClients' edit and view")
				}
				Expect(r.ofKind("MutatingWebhookConfiguration")).To(HaveLen(1))
				// Only guestbackup's ServiceAccounts write its Secrets (rbac_test.go).
				// With requests, the requester's too (requests_test.go).
				policies := 1
				if set.requests {
					policies = 2
				}
				Expect(r.ofKind("ValidatingAdmissionPolicy")).To(HaveLen(policies))
				Expect(r.ofKind("ValidatingAdmissionPolicyBinding")).To(HaveLen(policies))
			})

			It("registers exactly pkg/mutate's webhook, and pkg/requests' with requests enabled, pointing at the webhook Service", func() {
				cfg := as[admissionregistrationv1.MutatingWebhookConfiguration](r.find("MutatingWebhookConfiguration", release))
				if set.requests {
					Expect(cfg.Webhooks).To(HaveLen(2))
					got := cfg.Webhooks[1]
					Expect(got.ClientConfig.Service).To(Equal(&admissionregistrationv1.ServiceReference{
						Name: webhookName, Namespace: namespace, Path: ptr.To(requests.Path), Port: ptr.To[int32](443),
					}))
					Expect(got.ClientConfig.CABundle).To(Equal(cfg.Webhooks[0].ClientConfig.CABundle))
					Expect(got).To(Equal(requests.Webhook(got.ClientConfig)))
				} else {
					Expect(cfg.Webhooks).To(HaveLen(1))
				}
				got := cfg.Webhooks[0]
				Expect(got.ClientConfig.Service).To(Equal(&admissionregistrationv1.ServiceReference{
					Name: webhookName, Namespace: namespace, Path: ptr.To(mutate.Path), Port: ptr.To[int32](443),
				}))
				Expect(got.ClientConfig.URL).To(BeNil())
				Expect(got).To(Equal(mutate.Webhook(namespace, got.ClientConfig)))

				// The Service sends 443 to the webhook pods' 9443.
				svc := as[corev1.Service](r.find("Service", webhookName))
				Expect(svc.Spec.Ports).To(ConsistOf(HaveField("Port", int32(443))))
				d := as[appsv1.Deployment](r.find("Deployment", webhookName))
				for k, v := range svc.Spec.Selector {
					Expect(d.Spec.Template.Labels).To(HaveKeyWithValue(k, v))
				}
				c := d.Spec.Template.Spec.Containers[0]
				port := c.Ports[slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == svc.Spec.Ports[0].TargetPort.StrVal })]
				Expect(port.ContainerPort).To(Equal(int32(9443)))
				Expect(c.Args).To(ContainElement("--port=9443"))
			})

			It("lets whoever may view a namespace read its VMs' GuestProtections, and nothing else of guestbackup's", func() {
				view := as[rbacv1.ClusterRole](r.find("ClusterRole", release+"-view"))
				Expect(view.Labels).To(HaveKeyWithValue("rbac.authorization.k8s.io/aggregate-to-view", "true"), "aggregated into the built-in view role")
				Expect(view.Rules).To(Equal([]rbacv1.PolicyRule{{APIGroups: []string{"guestbackup.io"}, Resources: []string{"guestprotections"}, Verbs: []string{"get", "list", "watch"}}}))
				Expect(view.AggregationRule).To(BeNil())
				for _, o := range r.ofKind("ClusterRoleBinding") {
					Expect(as[rbacv1.ClusterRoleBinding](o).RoleRef.Name).NotTo(Equal(view.Name), "bound only through the built-in roles")
				}
			})

			It("lets a namespace's editors manage its BackupClients and its readers see them, never their status", func() {
				for _, role := range []struct {
					name  string
					to    []string
					verbs []string
				}{
					{name: release + "-clients-edit", to: []string{"admin", "edit"}, verbs: []string{"create", "delete", "deletecollection", "patch", "update"}},
					{name: release + "-clients-view", to: []string{"admin", "edit", "view"}, verbs: []string{"get", "list", "watch"}},
				} {
					cr := as[rbacv1.ClusterRole](r.find("ClusterRole", role.name))
					for _, to := range role.to {
						Expect(cr.Labels).To(HaveKeyWithValue("rbac.authorization.k8s.io/aggregate-to-"+to, "true"), "%s aggregated into %s", role.name, to)
					}
					Expect(cr.Rules).To(Equal([]rbacv1.PolicyRule{{APIGroups: []string{"guestbackup.io"}, Resources: []string{"backupclients"}, Verbs: role.verbs}}))
					for _, o := range r.ofKind("ClusterRoleBinding") {
						Expect(as[rbacv1.ClusterRoleBinding](o).RoleRef.Name).NotTo(Equal(cr.Name), "bound only through the built-in roles")
					}
				}
			})

			It("grants each binary exactly the rules generated from its markers", func() {
				generated := func(role string) []rbacv1.PolicyRule {
					GinkgoHelper()
					data, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", role, "role.yaml"))
					Expect(err).NotTo(HaveOccurred())
					want := &rbacv1.ClusterRole{}
					Expect(yaml.UnmarshalStrict(bytes.TrimPrefix(data, []byte("---\n")), want)).To(Succeed())
					Expect(want.Rules).NotTo(BeEmpty())
					return want.Rules
				}
				// The server pods' maintenance election: bound by no one but
				// the controller, which holds bind on it and on nothing else.
				maintenance := release + "-server-maintenance"
				Expect(as[rbacv1.ClusterRole](r.find("ClusterRole", maintenance)).Rules).To(Equal(generated("server-maintenance")))
				Expect(as[appsv1.Deployment](r.find("Deployment", release+"-controller")).Spec.Template.Spec.Containers[0].Args).To(
					ContainElement("--server-maintenance-cluster-role="+maintenance), "the controller binds the chart's ClusterRole")
				for _, binary := range []string{"controller", "webhook"} {
					want := generated(binary)
					if binary == "controller" {
						want = append(want, rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, Verbs: []string{"bind"}, ResourceNames: []string{maintenance}})
					}

					name := release + "-" + binary
					got := as[rbacv1.ClusterRole](r.find("ClusterRole", name))
					Expect(got.Rules).To(Equal(want), binary)

					binding := as[rbacv1.ClusterRoleBinding](r.find("ClusterRoleBinding", name))
					Expect(binding.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}))
					Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}}))
					r.find("ServiceAccount", name)
					d := as[appsv1.Deployment](r.find("Deployment", name))
					Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal(name))
				}
				// Leader election: leases in the release namespace.
				role := as[rbacv1.Role](r.find("Role", release+"-controller-leader-election"))
				Expect(role.Namespace).To(Equal(namespace))
				Expect(role.Rules).To(ContainElement(And(
					HaveField("APIGroups", []string{"coordination.k8s.io"}), HaveField("Resources", []string{"leases"}),
					HaveField("Verbs", ContainElements("get", "create", "update")))))
				binding := as[rbacv1.RoleBinding](r.find("RoleBinding", release+"-controller-leader-election"))
				Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: release + "-controller", Namespace: namespace}}))
			})

			It("aggregates the requests to the built-in roles only when they are enabled: admin and edit create and delete, view reads", func() {
				rule := func(verbs ...string) []rbacv1.PolicyRule {
					return []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: requests.Resources, Verbs: verbs}}
				}
				for _, role := range []struct {
					name, aggregates string
					rules            []rbacv1.PolicyRule
				}{
					{name: release + "-requests-edit", aggregates: "admin,edit", rules: rule("create", "delete", "get", "list", "watch")},
					{name: release + "-requests-view", aggregates: "view", rules: rule("get", "list", "watch")},
				} {
					if !set.requests {
						Expect(r.text).NotTo(ContainSubstring("name: " + role.name + "\n"))
						continue
					}
					got := as[rbacv1.ClusterRole](r.find("ClusterRole", role.name))
					Expect(got.Rules).To(Equal(role.rules))
					var aggregates []string
					for k, v := range got.Labels {
						if to, ok := strings.CutPrefix(k, "rbac.authorization.k8s.io/aggregate-to-"); ok && v == "true" {
							aggregates = append(aggregates, to)
						}
					}
					slices.Sort(aggregates)
					Expect(strings.Join(aggregates, ",")).To(Equal(role.aggregates))
				}
				Expect(as[appsv1.Deployment](r.find("Deployment", release+"-controller")).Spec.Template.Spec.Containers[0].Args).To(
					ContainElement(fmt.Sprintf("--requests=%t", set.requests)), "the controller carries requests out exactly when their API is installed")
				if !set.requests {
					Expect(r.text).NotTo(ContainSubstring("guestsnapshots"), "nothing of the requests without requests.enabled: no CRD, webhook or role")
				} else {
					// The controller's own, exactly: it reads requests and writes their
					// status, and creates a restore's Job and the claim it asks for.
					name := release + "-controller-requests"
					Expect(as[rbacv1.ClusterRole](r.find("ClusterRole", name)).Rules).To(Equal([]rbacv1.PolicyRule{
						{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"create", "get", "list", "watch"}},
						{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch"}},
						{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"guestrestores", "guestsnapshots"}, Verbs: []string{"get", "list", "watch"}},
						{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"guestrestores/finalizers"}, Verbs: []string{"update"}},
						{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"guestrestores/status", "guestsnapshots/status"}, Verbs: []string{"patch"}},
					}))
					binding := as[rbacv1.ClusterRoleBinding](r.find("ClusterRoleBinding", name))
					Expect(binding.RoleRef.Name).To(Equal(name))
					Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: release + "-controller", Namespace: namespace}}))
				}
			})

			It("runs restricted pods with no fixed UID or group", func() {
				// Nowhere, not only in pod specs: OpenShift's restricted SCC
				// assigns UIDs and groups itself.
				for _, field := range []string{"runAsUser", "runAsGroup", "fsGroup", "supplementalGroups"} {
					Expect(r.text).NotTo(ContainSubstring(field+":"), field)
				}
				for _, o := range r.ofKind("Deployment") {
					spec := as[appsv1.Deployment](o).Spec.Template.Spec
					Expect(spec.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
					Expect(spec.SecurityContext.SeccompProfile).To(Equal(&corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}))
					Expect(spec.HostNetwork || spec.HostPID || spec.HostIPC).To(BeFalse())
					for _, c := range containers(&spec) {
						sc := c.SecurityContext
						Expect(sc).NotTo(BeNil(), c.Name)
						Expect(sc.RunAsUser).To(BeNil(), c.Name)
						Expect(sc.RunAsNonRoot).To(Equal(ptr.To(true)), c.Name)
						Expect(sc.AllowPrivilegeEscalation).To(Equal(ptr.To(false)), c.Name)
						Expect(sc.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)), c.Name)
						Expect(sc.Capabilities).To(Equal(&corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}), c.Name)
						Expect(sc.SeccompProfile).To(Equal(&corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}), c.Name)
					}
				}
			})

			It("runs pods the API server's restricted Pod Security admission accepts", func() {
				// Pods need their ServiceAccount to exist.
				for _, o := range r.ofKind("ServiceAccount") {
					if err := apiServer.Client.Create(ctx, o.DeepCopy()); !apierrors.IsAlreadyExists(err) {
						Expect(err).NotTo(HaveOccurred())
					}
				}
				// The namespace enforces: a pod without a security context is refused.
				bare := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: "unrestricted", Namespace: namespace},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/c"}}},
				}
				Expect(apiServer.Client.Create(ctx, bare, client.DryRunAll)).To(MatchError(ContainSubstring("violates PodSecurity \"restricted")))
				for _, o := range r.ofKind("Deployment") {
					d := as[appsv1.Deployment](o)
					pod := &corev1.Pod{
						ObjectMeta: metav1.ObjectMeta{Name: d.Name + "-pod", Namespace: namespace, Labels: d.Spec.Template.Labels},
						Spec:       d.Spec.Template.Spec,
					}
					Expect(apiServer.Client.Create(ctx, pod, client.DryRunAll)).To(Succeed(), d.Name)
				}
			})

			It("keeps at least two webhook pods, spread across nodes, through disruptions", func() {
				d := as[appsv1.Deployment](r.find("Deployment", webhookName))
				Expect(*d.Spec.Replicas).To(BeNumerically(">=", 2))
				pdb := as[policyv1.PodDisruptionBudget](r.find("PodDisruptionBudget", webhookName))
				Expect(pdb.Spec.Selector.MatchLabels).To(Equal(d.Spec.Selector.MatchLabels))
				Expect(pdb.Spec.MinAvailable.IntValue()).To(BeNumerically(">=", 1))
				Expect(pdb.Spec.MinAvailable.IntValue()).To(BeNumerically("<", int(*d.Spec.Replicas)))
				anti := d.Spec.Template.Spec.Affinity.PodAntiAffinity
				Expect(anti.PreferredDuringSchedulingIgnoredDuringExecution).To(ConsistOf(HaveField("PodAffinityTerm", And(
					HaveField("TopologyKey", corev1.LabelHostname),
					HaveField("LabelSelector.MatchLabels", d.Spec.Selector.MatchLabels)))))
			})

			It("runs both binaries with probes, metrics and their flags", func() {
				for _, name := range []string{release + "-controller", webhookName} {
					d := as[appsv1.Deployment](r.find("Deployment", name))
					c := d.Spec.Template.Spec.Containers[0]
					Expect(c.Args).To(ContainElements("--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"))
					Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
					Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
					Expect(c.Ports).To(ContainElements(
						corev1.ContainerPort{Name: "health", ContainerPort: 8081, Protocol: corev1.ProtocolTCP},
						corev1.ContainerPort{Name: "metrics", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}))
					Expect(c.LivenessProbe.HTTPGet.Port.StrVal).To(Equal("health"))
					Expect(c.ReadinessProbe.HTTPGet.Port.StrVal).To(Equal("health"))
					metrics := as[corev1.Service](r.find("Service", name+"-metrics"))
					Expect(metrics.Spec.Ports).To(ConsistOf(And(HaveField("Port", int32(8080)), HaveField("TargetPort.StrVal", "metrics"))))
				}

				c := as[appsv1.Deployment](r.find("Deployment", release+"-controller")).Spec.Template.Spec.Containers[0]
				Expect(c.Command).To(Equal([]string{"/usr/local/bin/controller"}))
				Expect(c.Args).To(ContainElements("--server-image=ghcr.io/guestbackup/guestbackup:0.1.0", "--namespace=$(POD_NAMESPACE)", "--leader-elect=true", "--guest-not-connected-after=15m"))
				Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"},
				}}))
				// Each BSLS's own CA, through cert-manager when the chart uses it.
				Expect(c.Args).To(ContainElement(fmt.Sprintf("--cert-manager-ca=%t", set.certManager)))
			})

			It("lets only the API server reach the webhook and only the monitoring namespaces scrape metrics", func() {
				want := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}
				if set.file == "openshift.yaml" {
					want = &metav1.LabelSelector{MatchLabels: map[string]string{"network.openshift.io/policy-group": "monitoring"}}
				}
				for _, component := range []string{"controller", "webhook"} {
					name := release + "-" + component
					np := as[networkingv1.NetworkPolicy](r.find("NetworkPolicy", name))
					d := as[appsv1.Deployment](r.find("Deployment", name))
					Expect(np.Spec.PodSelector.MatchLabels).To(Equal(d.Spec.Selector.MatchLabels))
					Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{"Ingress"}))
					var metricsRule, webhookRule bool
					for _, rule := range np.Spec.Ingress {
						Expect(rule.Ports).To(HaveLen(1))
						switch rule.Ports[0].Port.IntVal {
						case 8080:
							Expect(rule.From).To(Equal([]networkingv1.NetworkPolicyPeer{{NamespaceSelector: want}}))
							metricsRule = true
						case 9443:
							Expect(component).To(Equal("webhook"))
							Expect(rule.From).To(BeEmpty(), "the API server's address is unknown: any source")
							webhookRule = true
						default:
							Fail("unexpected port in " + name)
						}
					}
					Expect(metricsRule).To(BeTrue())
					Expect(webhookRule).To(Equal(component == "webhook"))
				}
			})

			if set.certManager {
				It("takes the webhook's CA from cert-manager", func() {
					cfg := as[admissionregistrationv1.MutatingWebhookConfiguration](r.find("MutatingWebhookConfiguration", release))
					Expect(cfg.Webhooks[0].ClientConfig.CABundle).To(BeEmpty())
					Expect(cfg.Annotations).To(HaveKeyWithValue("cert-manager.io/inject-ca-from", namespace+"/"+webhookName))
					cert := r.find("Certificate", webhookName)
					Expect(cert.GetNamespace()).To(Equal(namespace))
					dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
					Expect(dnsNames).To(ContainElement(webhookName + "." + namespace + ".svc"))
					secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
					Expect(mountedCertSecret(r, webhookName)).To(Equal(secretName))
					Expect(r.ofKind("Secret")).To(BeEmpty(), "no key material in the release")

					// Serving certificate ← CA Issuer ← CA Certificate ← self-signed Issuer.
					issuerName, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
					caSecret, _, _ := unstructured.NestedString(r.find("Issuer", issuerName).Object, "spec", "ca", "secretName")
					var ca *unstructured.Unstructured
					for _, c := range r.ofKind("Certificate") {
						if s, _, _ := unstructured.NestedString(c.Object, "spec", "secretName"); s == caSecret {
							ca = c
						}
					}
					Expect(ca).NotTo(BeNil())
					isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA")
					Expect(isCA).To(BeTrue())
					root, _, _ := unstructured.NestedString(ca.Object, "spec", "issuerRef", "name")
					Expect(r.find("Issuer", root).Object).To(HaveKeyWithValue("spec", HaveKey("selfSigned")))

					// No CA shared by the servers: each BSLS gets its own.
					Expect(r.ofKind("ClusterIssuer")).To(BeEmpty())
				})
			} else {
				It("generates the webhook's CA and serving certificate itself, without cert-manager", func() {
					for _, o := range r.objects {
						Expect(o.GetAPIVersion()).NotTo(HavePrefix("cert-manager.io/"), o.GetKind())
					}
					cfg := as[admissionregistrationv1.MutatingWebhookConfiguration](r.find("MutatingWebhookConfiguration", release))
					Expect(cfg.Annotations).NotTo(HaveKey("cert-manager.io/inject-ca-from"))
					secret := as[corev1.Secret](r.find("Secret", webhookName+"-tls"))
					Expect(secret.Type).To(Equal(corev1.SecretTypeTLS))
					Expect(mountedCertSecret(r, webhookName)).To(Equal(secret.Name))
					Expect(cfg.Webhooks[0].ClientConfig.CABundle).To(Equal(secret.Data["ca.crt"]))
					verifyServing(secret.Data, webhookName+"."+namespace+".svc")
				})
			}
		})
	}

	It("keeps its own webhook CA and certificate across upgrades (lookup, helm --dry-run=server)", func() {
		ctx := context.Background()
		const namespace = "gb-upgrade"
		Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})).To(Succeed())
		install := func() rendered {
			GinkgoHelper()
			out, err := helm("template", release, chartDir, "--namespace", namespace, "--values", "testdata/no-cert-manager.yaml",
				"--dry-run=server", "--kubeconfig", kubeconfig)
			Expect(err).NotTo(HaveOccurred())
			return rendered{text: out, objects: decode(out)}
		}

		// The first install generates the Secret; store it as the install would.
		first := as[corev1.Secret](install().find("Secret", release+"-webhook-tls"))
		stored := first.DeepCopy()
		stored.ResourceVersion = ""
		Expect(apiServer.Client.Create(ctx, stored)).To(Succeed())

		second := install()
		Expect(as[corev1.Secret](second.find("Secret", release+"-webhook-tls")).Data).To(Equal(first.Data))
		cfg := as[admissionregistrationv1.MutatingWebhookConfiguration](second.find("MutatingWebhookConfiguration", release))
		Expect(cfg.Webhooks[0].ClientConfig.CABundle).To(Equal(first.Data["ca.crt"]))
	})
})

// mountedCertSecret is the Secret mounted at the webhook's --cert-dir.
func mountedCertSecret(r rendered, name string) string {
	GinkgoHelper()
	spec := as[appsv1.Deployment](r.find("Deployment", name)).Spec.Template.Spec
	certDir, ok := argValue(spec.Containers[0].Args, "--cert-dir")
	Expect(ok).To(BeTrue(), "the webhook is given --cert-dir")
	i := slices.IndexFunc(spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == certDir })
	Expect(i).NotTo(Equal(-1), "a volume is mounted at --cert-dir")
	volume := spec.Containers[0].VolumeMounts[i].Name
	for _, v := range spec.Volumes {
		if v.Name == volume {
			Expect(v.Secret).NotTo(BeNil())
			return v.Secret.SecretName
		}
	}
	Fail("no volume " + volume)
	return ""
}

// verifyServing checks that tls.crt is a serving certificate for dnsName,
// signed by ca.crt, with the key tls.key.
func verifyServing(data map[string][]byte, dnsName string) {
	GinkgoHelper()
	roots := x509.NewCertPool()
	Expect(roots.AppendCertsFromPEM(data["ca.crt"])).To(BeTrue(), "ca.crt holds a PEM certificate")
	block, _ := pem.Decode(data["tls.crt"])
	Expect(block).NotTo(BeNil())
	leaf, err := x509.ParseCertificate(block.Bytes)
	Expect(err).NotTo(HaveOccurred())
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: dnsName, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	Expect(err).NotTo(HaveOccurred())
	_, err = tls.X509KeyPair(data["tls.crt"], data["tls.key"])
	Expect(err).NotTo(HaveOccurred(), "tls.key is the certificate's key")
}

// describesAll checks that the schema node describes every key of values, and
// every property it declares, with a description; it stops at free-form
// objects (resources, nodeSelector, affinity...), which declare no properties.
func describesAll(path string, schema map[string]any, values map[string]any) {
	GinkgoHelper()
	props, ok := schema["properties"].(map[string]any)
	if !ok {
		return
	}
	Expect(schema).To(HaveKeyWithValue("additionalProperties", false), "%s admits only the values it describes", path)
	for key := range values {
		Expect(props).To(HaveKey(key), "the schema describes %s.%s", path, key)
	}
	for key, p := range props {
		prop := p.(map[string]any)
		Expect(prop).To(HaveKeyWithValue("description", Not(BeEmpty())), "%s.%s has a description", path, key)
		nested, _ := values[key].(map[string]any)
		describesAll(path+"."+key, prop, nested)
	}
}
