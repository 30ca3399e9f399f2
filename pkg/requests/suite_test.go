package requests_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/internal/webhook"
	"github.com/guestbackup/guestbackup/pkg/requests"
)

// The requests' admission as a cluster runs it with requests.enabled: a
// real kube-apiserver that enforces RBAC, with the webhook configuration
// requests.Webhook (as the chart installs it) pointing at the webhook
// binary's wiring (internal/webhook), kube-controller-manager's ClusterRole
// aggregation, and the chart's own aggregated ClusterRoles and requester
// policy. Tenants are API
// users impersonated by a real client, each bound to a built-in role in
// one namespace only.

// The parties.
const (
	teamA = "team-a"
	teamB = "team-b"
	// alice edits team-a, carol views it, bob edits team-b.
	alice = "alice"
	carol = "carol"
	bob   = "bob"
	// alicesGroup is a group of alice's, stamped with her name.
	alicesGroup = "team-a-devs"
)

var (
	api *testbed.APIServer
	// asAlice, asCarol and asBob are clients impersonating each tenant.
	asAlice, asCarol, asBob client.Client
)

func TestRequests(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	RunSpecs(t, "Requests admission")
}

var _ = BeforeSuite(func() {
	ctx := context.Background()
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "guestbackup"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{requests.Webhook(admissionregistrationv1.WebhookClientConfig{
			Service: &admissionregistrationv1.ServiceReference{Name: "guestbackup-webhook", Namespace: "guestbackup-system", Path: ptr.To(requests.Path)},
		})},
	}
	api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{Webhooks: envtest.WebhookInstallOptions{
		MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{cfg},
	}})

	By("serving the webhook as cmd/webhook does")
	wh := api.Env.WebhookInstallOptions
	server := ctrlwebhook.NewServer(ctrlwebhook.Options{Host: wh.LocalServingHost, Port: wh.LocalServingPort, CertDir: wh.LocalServingCertDir})
	stop, err := testbed.RunManager(api, testbed.ManagerOptions{WebhookServer: server, Cache: webhook.Cache()}, webhook.Setup)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(stop)
	Eventually(func() error { return server.StartedChecker()(nil) }).Should(Succeed())

	By("installing the chart's request roles and policy, aggregated and type-checked as a cluster's controller manager does")
	testbed.StartControllerManager(GinkgoT(), api, testbed.RoleAggregationController, testbed.PolicyStatusController)
	for _, o := range chartRequests() {
		Expect(api.Client.Create(ctx, o)).To(Succeed(), "%s %s", o.GetObjectKind().GroupVersionKind().Kind, o.GetName())
	}
	Eventually(func(g Gomega) {
		p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		g.Expect(api.Client.Get(ctx, client.ObjectKey{Name: "guestbackup-requester"}, p)).To(Succeed())
		g.Expect(p.Status.TypeChecking).NotTo(BeNil(), "the requester policy is type-checked")
		g.Expect(p.Status.TypeChecking.ExpressionWarnings).To(BeEmpty())
		for _, builtin := range []string{"admin", "edit", "view"} {
			role := &rbacv1.ClusterRole{}
			g.Expect(api.Client.Get(ctx, client.ObjectKey{Name: builtin}, role)).To(Succeed())
			g.Expect(role.Rules).To(ContainElement(HaveField("Resources", requests.Resources)), builtin)
		}
	}).Should(Succeed())

	By("giving each tenant a built-in role in one namespace")
	for _, ns := range []string{teamA, teamB} {
		Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	}
	for _, b := range []struct{ user, role, namespace string }{{alice, "edit", teamA}, {carol, "view", teamA}, {bob, "edit", teamB}} {
		Expect(api.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.user + "-" + b.role, Namespace: b.namespace},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: b.user}},
		})).To(Succeed())
	}
	asAlice, asCarol, asBob = clientAs(alice, alicesGroup), clientAs(carol), clientAs(bob)

	By("creating the VMs, as their owners left them")
	for _, vm := range []struct {
		namespace, name string
		annotations     map[string]string
	}{
		// web backs up /etc; new may read the snapshots of old, which
		// is gone; db grants nothing; plain never opted in.
		{teamA, "web", map[string]string{v1alpha1.AnnotationServer: "backup/main", v1alpha1.AnnotationPaths: "/etc"}},
		{teamA, "new", map[string]string{v1alpha1.AnnotationServer: "backup/main", v1alpha1.AnnotationRestoreFrom: "old"}},
		{teamA, "db", map[string]string{v1alpha1.AnnotationServer: "backup/main"}},
		{teamA, "plain", nil},
		// secret is team-b's only.
		{teamB, "secret", map[string]string{v1alpha1.AnnotationServer: "backup/main", v1alpha1.AnnotationPaths: "/srv"}},
	} {
		Expect(api.Client.Create(ctx, testbed.SmallVM(vm.namespace, vm.name, vm.annotations))).To(Succeed())
	}
})

// clientAs is a client of the API server impersonating user, in groups
// (and system:authenticated, which the API server adds).
func clientAs(user string, groups ...string) client.Client {
	GinkgoHelper()
	cfg := rest.CopyConfig(api.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: api.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// chartRequests are the chart's objects for requests beside the webhook
// entry, rendered by helm with requests.enabled, as an install creates
// them: the ClusterRoles aggregated to the built-in roles, and the policy
// that has the last word on the requester.
func chartRequests() []*unstructured.Unstructured {
	GinkgoHelper()
	tools, err := testbed.LoadTools()
	Expect(err).NotTo(HaveOccurred())
	root, err := testbed.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	var stderr bytes.Buffer
	cmd := exec.Command(tools.Helm, "template", "guestbackup", filepath.Join(root, "charts", "guestbackup"), "--set", "requests.enabled=true",
		"--show-only", "templates/requests-rbac.yaml", "--show-only", "templates/requests-policy.yaml")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), stderr.String())
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		o := &unstructured.Unstructured{}
		err := dec.Decode(&o.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		Expect(err).NotTo(HaveOccurred())
		if len(o.Object) > 0 {
			objs = append(objs, o)
		}
	}
	Expect(objs).To(HaveLen(4), "two ClusterRoles, a ValidatingAdmissionPolicy and its binding")
	return objs
}

// yesterday is a time for "before" selectors well in the past of the
// webhook's clock.
var yesterday = metav1.NewTime(time.Now().Add(-24 * time.Hour))
