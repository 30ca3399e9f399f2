package chart

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// The requester policy alone: this API server runs no guestbackup webhook,
// so what it admits or refuses is the chart's ValidatingAdmissionPolicy's
// doing, as on a cluster where the webhook entry is missing or a webhook
// that runs after guestbackup's rewrites the requester. pkg/requests
// proves the webhook and the policy together, the policy type-checked.
var _ = Describe("The requests' requester policy, enforced by a real API server", Ordered, func() {
	const (
		policyRelease = "requests"
		ns            = "guestbackup-requests"
		team          = "requests-team"
	)
	var (
		ctx   context.Context
		alice client.Client
	)

	BeforeAll(func() {
		ctx = context.Background()
		for _, name := range []string{ns, team} {
			Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
		}
		r := renderRelease(policyRelease, ns, "requests.yaml")
		policy := policyRelease + "-guestbackup-requester"
		Expect(apiServer.Client.Create(ctx, r.find("ValidatingAdmissionPolicy", policy).DeepCopy())).To(Succeed())
		Expect(apiServer.Client.Create(ctx, r.find("ValidatingAdmissionPolicyBinding", policy).DeepCopy())).To(Succeed())
		// alice edits requests in her team's namespace, by the chart's
		// role (bound directly: this API server aggregates nothing).
		edit := r.find("ClusterRole", policyRelease+"-guestbackup-requests-edit").DeepCopy()
		Expect(apiServer.Client.Create(ctx, edit)).To(Succeed())
		Expect(apiServer.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice", Namespace: team},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: edit.GetName()},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
		})).To(Succeed())
		cfg := rest.CopyConfig(apiServer.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"team-devs"}}
		var err error
		alice, err = client.New(cfg, client.Options{Scheme: apiServer.Scheme})
		Expect(err).NotTo(HaveOccurred())

	})

	snapshot := func(name string, r *v1alpha1.Requester) *v1alpha1.GuestSnapshot {
		return &v1alpha1.GuestSnapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: team}, Spec: v1alpha1.GuestSnapshotSpec{VM: "web", Requester: r}}
	}
	refused := And(
		Satisfy(apierrors.IsForbidden),
		MatchError(ContainSubstring("spec.requester of a GuestSnapshot must be its creator, alice, as guestbackup's webhook requests.guestbackup.io stamps it")),
	)

	It("refuses a request whose requester is not its creator, forged or missing", func() {
		// The API server loads a new policy asynchronously: the first
		// refusal is awaited (a request let through meanwhile is removed).
		Eventually(func() error {
			s := snapshot("forged", &v1alpha1.Requester{Username: "system:admin", Groups: []string{"system:masters"}})
			err := alice.Create(ctx, s)
			if err == nil {
				Expect(apiServer.Client.Delete(ctx, s)).To(Succeed())
			}
			return err
		}).WithTimeout(30 * time.Second).Should(refused)

		Expect(alice.Create(ctx, snapshot("unstamped", nil))).To(refused)
		Expect(alice.Create(ctx, snapshot("other-groups", &v1alpha1.Requester{Username: "alice", Groups: []string{"team-devs", "system:authenticated", "system:masters"}}))).To(refused)
		Expect(alice.Create(ctx, snapshot("no-groups", &v1alpha1.Requester{Username: "alice"}))).To(refused)
	})

	It("admits a request that names exactly its creator, as the webhook stamps it", func() {
		Expect(alice.Create(ctx, snapshot("stamped", &v1alpha1.Requester{Username: "alice", Groups: []string{"team-devs", "system:authenticated"}}))).To(Succeed())
	})
})
