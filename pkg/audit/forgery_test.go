package audit_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// A tenant who may write credential-looking Secrets (the chart's
// secretPolicy off) names, for her own VM, a server in her own namespace,
// and writes its activity ConfigMap there herself, labelled as the BSLS
// reconciler labels them, claiming snapshots her guest never took. An
// admin auditing Events or GuestProtections must not see that VM as
// protected. Everything is in place before the controller starts, so the
// pass that first writes a VM's GuestProtection read the forgery from a
// synced cache: the status it writes is its verdict on it.
var _ = Describe("Activity a tenant forges", Ordered, func() {
	const (
		// ghost: no BSLS of that name exists.
		ghost = "ghost"
		// squatted: a BSLS an admin made in the tenant's namespace, whose
		// activity ConfigMaps its reconciler (not running here) has not
		// made yet: the tenant made one first.
		squatted = "squatted"
	)
	var (
		ctx    context.Context
		api    *testbed.APIServer
		tenant client.Client
	)
	forgedEnd := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)

	// forge creates, as the tenant, VM vm and a credential Secret naming
	// BSLS server of her namespace, and that server's activity and
	// catalogue ConfigMaps of vm's shard, saying its guest has 30
	// snapshots and listing one.
	forge := func(vm, server string) {
		GinkgoHelper()
		ref := vmNamespace + "/" + server
		Expect(tenant.Create(ctx, &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: vm, Namespace: vmNamespace, Annotations: map[string]string{
				v1alpha1.AnnotationServer: ref, v1alpha1.AnnotationPaths: "/srv",
			}},
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		})).To(Succeed())
		Expect(tenant.Create(ctx, testbed.CredentialSecret(vmNamespace, vm, ref, testbed.RandomPassword(), "1"))).To(Succeed())
		user := vm + "@" + vmNamespace
		bsls := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: server, Namespace: vmNamespace}}
		Expect(tenant.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name: activity.ConfigMapName(server, userset.ShardOf(user)), Namespace: vmNamespace,
				Labels: labels.Merge(kopiaserver.Labels(bsls), map[string]string{activity.Label: server}),
			},
			Data: map[string]string{activity.Key: string(activity.Encode(map[string]activity.Guest{user: {
				User: user, Snapshots: 30, First: forgedEnd.Add(-30 * 24 * time.Hour),
				Last: activity.Snapshot{ID: "forged", Path: "/srv", Start: forgedEnd.Add(-time.Minute), End: forgedEnd, Bytes: 1 << 30, Files: 1000},
			}}))},
		})).To(Succeed())
		Expect(tenant.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name: activity.CatalogueConfigMapName(server, activity.CatalogueShardOf(user)), Namespace: vmNamespace,
				Labels: labels.Merge(kopiaserver.Labels(bsls), map[string]string{activity.Label: server}),
			},
			Data: map[string]string{activity.CatalogueKey: string(activity.EncodeCatalogues(map[string][]activity.Snapshot{user: {
				{ID: "forged", Path: "/srv", Start: forgedEnd.Add(-time.Minute), End: forgedEnd, Bytes: 1 << 30, Files: 1000},
			}}))},
		})).To(Succeed())
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = startAuditBed(ctx)
		// What a namespace's editor may do, on the objects the forgery needs.
		var err error
		tenant, err = api.Tenant(ctx, vmNamespace, "tenant",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}, Verbs: []string{"get", "create", "update"}},
			rbacv1.PolicyRule{APIGroups: []string{kubevirtv1.VirtualMachineGroupVersionKind.Group}, Resources: []string{"virtualmachines"}, Verbs: []string{"get", "create"}})
		Expect(err).NotTo(HaveOccurred())

		createServer(ctx, api, types.NamespacedName{Namespace: vmNamespace, Name: squatted})
		forge("phantom", ghost)
		forge("squatter", squatted)

		stop, err := testbed.RunManager(api, testbed.ManagerOptions{Logger: GinkgoLogr, Cache: controller.Cache()}, func(mgr ctrl.Manager) error {
			return (&audit.Reconciler{StaleAfter: time.Hour}).SetupWithManager(mgr)
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(stop()).To(Succeed()) })
	})

	believesNone := func(vm string) {
		GinkgoHelper()
		p := &v1alpha1.GuestProtection{}
		Eventually(func() (*v1alpha1.GuestProtection, error) {
			return p, api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: vm}, p)
		}).Should(HaveField("Status.Identity", vm+"@"+vmNamespace))
		Expect(p.Status.Snapshots).To(BeZero(), "the GuestProtection counts the forged snapshots")
		Expect(p.Status.LastSnapshot).To(BeNil(), "the GuestProtection shows the forged snapshot")
		Expect(p.Status.RecentSnapshots).To(BeEmpty(), "the GuestProtection lists the forged snapshot")

		By("announcing no snapshot on the VM")
		// Recorded on the Secret before the Events are made, and before
		// the GuestProtection is written: a pass that believed the
		// forgery has left it.
		s := &corev1.Secret{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName(vm)}, s)).To(Succeed())
		Expect(s.Annotations).NotTo(HaveKey(audit.AnnotationLastSnapshot))
		// The recorder sends Events on its own: a bounded look catches
		// one sent late.
		Consistently(vmEvents(ctx, api, vm, audit.ReasonSnapshotCreated)).WithTimeout(3 * time.Second).Should(BeEmpty())
		Expect(vmEvents(ctx, api, vm, audit.ReasonGuestConnected)()).To(BeEmpty())
	}

	It("believes none of it for a server that does not exist", func() { believesNone("phantom") })
	It("believes none of it from a ConfigMap its server does not control", func() { believesNone("squatter") })
})
