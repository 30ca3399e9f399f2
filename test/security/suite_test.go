// Package security is guestbackup's adversarial suite: hostile guests and
// hostile tenants try every known attack against the product as it runs
// on the test bed (internal/local), and each spec proves the attack is
// refused with an answer a human understands while nothing legitimate is
// lost.
//
// The parties are real: a kube-apiserver that enforces RBAC, guestbackup's
// webhook and controllers, each BSLS's Kopia server run from the
// Deployment the controller writes (with the server pod's own service
// account), and the kopia CLI as a guest or a tenant uses it. A tenant is
// an API user bound to a Role in one namespace, as a cluster gives a team;
// a guest is whoever holds a VM's credentials.
package security

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Bounds of what the product does on its own; generous, because CI's two
// cores are busy.
const (
	// readyTimeout bounds a BSLS becoming Ready once its server pod runs.
	readyTimeout = 90 * time.Second
	// provisionTimeout bounds a VM's user reaching the users Secrets.
	provisionTimeout = 60 * time.Second
)

var (
	platform *local.Platform
	ctx      context.Context
)

func TestSecurity(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	// controller-runtime's informers log through its global logger.
	ctrl.SetLogger(GinkgoLogr)
	RunSpecs(t, "Hostile guests and tenants against guestbackup")
}

var _ = BeforeSuite(func() {
	ctx = context.Background()
	platform = local.Start(GinkgoT(), local.Options{Logger: GinkgoLogr})
})

// newNamespace creates a namespace, as the cluster admin.
func newNamespace(name string, labels map[string]string) {
	GinkgoHelper()
	Expect(platform.API.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})).To(Succeed())
}

// Tenant is an API user whose rights are a Role in one namespace: what a
// cluster admin gives a team that runs VMs.
type Tenant struct {
	// Name is the user's name, as the API server authenticates it.
	Name string
	// Namespace is the one namespace the tenant's Role is in.
	Namespace string
	// Config authenticates as the tenant (a client certificate).
	Config *rest.Config
	// Client is a client as the tenant.
	Client client.Client
}

// tenantRules are a team's rights in its own namespace: its VMs, their
// Secrets and ConfigMaps (including a VM's own cloud-init), and
// certificates, as an application team commonly has.
var tenantRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}, Verbs: []string{rbacv1.VerbAll}},
	{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachines"}, Verbs: []string{rbacv1.VerbAll}},
	{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates", "issuers", "certificaterequests"}, Verbs: []string{rbacv1.VerbAll}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"get", "list", "watch"}},
}

// newTenant creates the API user user with tenantRules in namespace, and
// nothing anywhere else.
func newTenant(user, namespace string) *Tenant {
	GinkgoHelper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-" + user, Namespace: namespace},
		Rules:      tenantRules,
	}
	Expect(platform.API.Client.Create(ctx, role)).To(Succeed())
	Expect(platform.API.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-" + user, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	})).To(Succeed())
	authn, err := platform.API.Env.AddUser(envtest.User{Name: user, Groups: []string{"system:authenticated"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	cfg := authn.Config()
	c, err := client.New(cfg, client.Options{Scheme: platform.API.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return &Tenant{Name: user, Namespace: namespace, Config: cfg, Client: c}
}

// Server is a BSLS whose Kopia server runs, and how the host reaches it.
type Server struct {
	BSLS *v1alpha1.BackupStorageLocationServer
	// URL is the server as a client on the host reaches it, and the BSLS's
	// clientURL: the address guests are told.
	URL string
	// CA is the BSLS's status.tlsCA, what guests trust; Pin is its
	// fingerprint (status.tlsFingerprint), to compare CAs by.
	CA  []byte
	Pin string
	// Pod is the server pod, run from the controller's Deployment.
	Pod *testbed.Pod
}

// serveBSLS creates b as the cluster admin, runs its Kopia server from the
// Deployment the controller writes (with the server pod's own service
// account), and waits until the BSLS is Ready. The server pod lives as
// long as the spec container that called it. Guests of the test bed reach
// the server on a loopback port, which the admin gives them as the
// BSLS's clientURL, as for guests that cannot resolve cluster DNS: the
// server's certificate names it, and guests check that it does.
func serveBSLS(b *v1alpha1.BackupStorageLocationServer) Server {
	GinkgoHelper()
	port, err := testbed.FreePorts(2)
	Expect(err).NotTo(HaveOccurred())
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	b.Spec.ClientURL = url
	Expect(platform.API.Client.Create(ctx, b)).To(Succeed())
	pod, err := platform.ServeBSLS(ctx, GinkgoT(), b, port)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() []metav1.Condition {
		Expect(platform.API.Client.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
		return b.Status.Conditions
	}).WithTimeout(readyTimeout).Should(ContainElement(And(
		HaveField("Type", v1alpha1.ConditionReady), HaveField("Status", metav1.ConditionTrue))),
		"BSLS %s/%s Ready", b.Namespace, b.Name)
	Expect(b.Status.TLSFingerprint).To(HaveLen(64))
	Expect(b.Status.Endpoint).To(Equal(url))
	return Server{BSLS: b, URL: url, CA: []byte(b.Status.TLSCA), Pin: b.Status.TLSFingerprint, Pod: pod}
}

// isReady is whether b's Ready condition is True now.
func isReady(b *v1alpha1.BackupStorageLocationServer) bool {
	return meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.ConditionReady)
}

// vmFor is a small VM opted in to server (<namespace>/<name>), with no
// cloud-init of its own: the webhook gives it the bootstrap volume.
func vmFor(namespace, name, server string) *kubevirtv1.VirtualMachine {
	return testbed.SmallVM(namespace, name, map[string]string{v1alpha1.AnnotationServer: server})
}

// createVM creates, as c, a VM opted in to server; the API server runs it
// through guestbackup's webhook. It returns the VM as stored.
func createVM(c client.Client, namespace, name, server string) *kubevirtv1.VirtualMachine {
	GinkgoHelper()
	vm := vmFor(namespace, name, server)
	Expect(c.Create(ctx, vm)).To(Succeed())
	stored := &kubevirtv1.VirtualMachine{}
	Expect(platform.API.Client.Get(ctx, client.ObjectKeyFromObject(vm), stored)).To(Succeed())
	Expect(stored.Annotations).To(HaveKey(v1alpha1.AnnotationStatus), "the webhook injected VM %s/%s", namespace, name)
	return stored
}

// usersOf returns what the users Secret of username's shard lists, for
// the BSLS b.
func usersOf(b *v1alpha1.BackupStorageLocationServer, username string) string {
	s := &corev1.Secret{}
	key := types.NamespacedName{Namespace: b.Namespace, Name: userset.SecretName(b.Name, userset.ShardOf(username))}
	if err := platform.API.Client.Get(ctx, key, s); err != nil {
		return ""
	}
	return string(s.Data[userset.Key])
}

// waitProvisioned waits until the controller has handed VM vm's user to
// the server of s (its users Secret lists it) and the server's user sync
// has applied it (its user can log in), and returns the VM's Kopia
// username and password as its guest holds them.
func waitProvisioned(s Server, namespace, vm string) (username, password string) {
	GinkgoHelper()
	username = vm + "@" + namespace
	Eventually(func() string { return usersOf(s.BSLS, username) }).WithTimeout(provisionTimeout).
		Should(ContainSubstring(username+" "), "the users Secrets list %s", username)
	secret := &corev1.Secret{}
	Expect(platform.API.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: v1alpha1.CredentialSecretName(vm)}, secret)).To(Succeed())
	password = string(secret.Data[v1alpha1.SecretKeyPassword])
	Expect(password).NotTo(BeEmpty())
	Eventually(func() error {
		_, err := loginAs(s, username, password)
		return err
	}).WithTimeout(provisionTimeout).WithPolling(time.Second).Should(Succeed(), "%s logs in to its server", username)
	return username, password
}

// loginAs connects a fresh kopia client to s as username (user@host) with
// password, trusting the BSLS's CA only, as a guest does. The error carries
// kopia's own words.
func loginAs(s Server, username, password string) (*testbed.KopiaClient, error) {
	kopia := testbed.NewKopiaClient(GinkgoT())
	out, err := kopia.Connect(ctx, s.URL, s.CA, username, password)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	return kopia, nil
}

// refusedLogin matches kopia's words when a server refuses credentials.
func refusedLogin() OmegaMatcher {
	return MatchError(Or(ContainSubstring("access denied"), ContainSubstring("Unauthenticated"), ContainSubstring("invalid username or password")))
}

// bslsFor returns a BSLS on a fresh filesystem claim, for the VMs of
// namespaces labelled selector.
func bslsFor(namespace, name string, selector map[string]string, appendOnly bool) *v1alpha1.BackupStorageLocationServer {
	return &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access: v1alpha1.AccessSpec{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: selector},
				AppendOnly:        appendOnly,
			},
		},
	}
}
