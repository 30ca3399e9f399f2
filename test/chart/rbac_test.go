package chart

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	gtypes "github.com/onsi/gomega/types"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/internal/webhook"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// The chart's RBAC is proven by running guestbackup's own code as the
// chart's ServiceAccounts (impersonated) against a real API server that
// holds exactly the chart's RBAC objects.
var _ = Describe("The chart's RBAC, enforced by a real API server", Ordered, func() {
	const (
		rbacRelease = "rbac"
		ns          = "guestbackup-rbac"
		vmNS        = "rbac-vms"
		bsNS        = "rbac-backup"
		vmName      = "web"
	)
	var (
		ctx               context.Context
		controllerConfig  *rest.Config
		webhookConfig     *rest.Config
		controllerAccount string
		webhookAccount    string
	)
	// serviceAccount is a client config as ServiceAccount account of
	// namespace.
	serviceAccount := func(namespace, account string) *rest.Config {
		cfg := rest.CopyConfig(apiServer.Config)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + namespace + ":" + account,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		}
		return cfg
	}
	as := func(account string) *rest.Config { return serviceAccount(ns, account) }
	clientAs := func(cfg *rest.Config) client.Client {
		GinkgoHelper()
		c, err := client.New(cfg, client.Options{Scheme: apiServer.Scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}

	BeforeAll(func() {
		ctx = context.Background()
		for _, name := range []string{ns, vmNS, bsNS} {
			Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"backup": "yes"}}})).To(Succeed())
		}
		// Its own release, so that its ClusterRoles, created for real, do
		// not meet the other specs' server-side dry runs.
		r := renderRelease(rbacRelease, ns, "no-cert-manager.yaml")
		// With the admission policy guarding guestbackup's Secrets, so
		// that the specs below show the binaries' own writes pass it.
		for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
			for _, o := range r.ofKind(kind) {
				Expect(apiServer.Client.Create(ctx, o.DeepCopy())).To(Succeed(), "%s %s", kind, o.GetName())
			}
		}
		for _, sa := range r.ofKind("ServiceAccount") {
			switch name := sa.GetName(); {
			case strings.HasSuffix(name, "-controller"):
				controllerAccount = name
			case strings.HasSuffix(name, "-webhook"):
				webhookAccount = name
			}
		}
		Expect(controllerAccount).NotTo(BeEmpty())
		Expect(webhookAccount).NotTo(BeEmpty())
		controllerConfig, webhookConfig = as(controllerAccount), as(webhookAccount)
	})

	It("lets the controller, as its ServiceAccount, run a BSLS's server and take a VM's credentials", func() {
		mgr, err := manager.NewManager(controllerConfig, ctrl.Options{
			Scheme: apiServer.Scheme, Logger: GinkgoLogr,
			Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
			// As the chart runs it: electing a leader through a Lease in its namespace.
			LeaderElection: true, LeaderElectionID: "controller.guestbackup.io", LeaderElectionNamespace: ns,
			LeaseDuration: ptr.To(15 * time.Second), RenewDeadline: ptr.To(10 * time.Second), RetryPeriod: ptr.To(time.Second),
			Controller: config.Controller{SkipNameValidation: ptr.To(true)},
			Cache:      controller.Cache(),
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(controller.Setup(mgr, controller.Options{Image: "guestbackup:test", Namespace: ns, ActivityInterval: time.Minute, Hashers: 1,
			MaintenanceClusterRole: rbacRelease + "-guestbackup-server-maintenance"})).To(Succeed())
		mgrCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mgr.Start(mgrCtx) }()
		DeferCleanup(func() {
			cancel()
			Eventually(done).WithTimeout(30 * time.Second).Should(Receive(BeNil()))
		})

		By("electing itself leader through the Lease in its namespace")
		Eventually(mgr.Elected()).WithTimeout(30 * time.Second).Should(BeClosed())
		lease := &coordinationv1.Lease{}
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "controller.guestbackup.io"}, lease)).To(Succeed())
		Expect(lease.Spec.HolderIdentity).To(HaveValue(Not(BeEmpty())))

		bsls := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: bsNS},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
				Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "yes"}}},
			},
		}
		Expect(apiServer.Client.Create(ctx, bsls)).To(Succeed())
		By("writing the server's certificate, identity, Role and Deployment")
		Eventually(func() error {
			return apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: kopiaserver.DeploymentName(bsls)}, &appsv1.Deployment{})
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Eventually(func() string {
			b := &v1alpha1.BackupStorageLocationServer{}
			_ = apiServer.Client.Get(ctx, client.ObjectKeyFromObject(bsls), b)
			return b.Status.TLSFingerprint
		}).WithTimeout(30 * time.Second).ShouldNot(BeEmpty())

		By("granting the server pods of a BSLS with two replicas their maintenance Lease through the one ClusterRole it may bind")
		scaled := bsls.DeepCopy()
		scaled.ObjectMeta = metav1.ObjectMeta{Name: "scaled", Namespace: bsNS}
		scaled.Spec.Replicas = ptr.To[int32](2)
		Expect(apiServer.Client.Create(ctx, scaled)).To(Succeed())
		binding := &rbacv1.RoleBinding{}
		Eventually(func() error {
			return apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "scaled-server-maintenance"}, binding)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(binding.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: rbacRelease + "-guestbackup-server-maintenance"}))
		maintenanceLease := &coordinationv1.Lease{}
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: maintenancestate.LeaseName("scaled")}, maintenanceLease)).To(Succeed())
		// The controller writes the server's Role with its other objects,
		// after the maintenance binding (a pass's write step).
		role := &rbacv1.Role{}
		Eventually(func() error {
			return apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "scaled-server"}, role)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(role.Rules).NotTo(ContainElement(HaveField("Resources", ContainElement("leases"))), "the server's own Role grants no Lease")
		// A pod of the BSLS takes the Lease as client-go's LeaseLock does.
		pod := clientAs(serviceAccount(bsNS, "scaled-server"))
		Expect(pod.Get(ctx, client.ObjectKeyFromObject(maintenanceLease), maintenanceLease)).To(Succeed())
		maintenanceLease.Spec.HolderIdentity = ptr.To("scaled-server-0")
		Expect(pod.Update(ctx, maintenanceLease)).To(Succeed())
		By("and none to the server of a BSLS with one")
		Expect(apierrors.IsNotFound(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "main-server-maintenance"}, &rbacv1.RoleBinding{}))).To(BeTrue())
		Expect(apierrors.IsForbidden(clientAs(serviceAccount(bsNS, "main-server")).Get(ctx, client.ObjectKeyFromObject(maintenanceLease), &coordinationv1.Lease{}))).To(BeTrue())

		By("hashing a VM's password, writing its user and adopting its Secret")
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: vmName, Namespace: vmNS, Annotations: map[string]string{v1alpha1.AnnotationServer: bsNS + "/main"}},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		Expect(apiServer.Client.Create(ctx, vm)).To(Succeed())
		Expect(apiServer.Client.Create(ctx, testbed.CredentialSecret(vmNS, vmName, bsNS+"/main", "a-password-of-the-vm-0123456789", "1"))).To(Succeed())
		Eventually(func() string {
			s := &corev1.Secret{}
			_ = apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: userset.SecretName("main", userset.ShardOf(vmName+"@"+vmNS))}, s)
			return string(s.Data[userset.Key])
		}).WithTimeout(30 * time.Second).Should(ContainSubstring(vmName + "@" + vmNS))
		Eventually(func() []metav1.OwnerReference {
			s := &corev1.Secret{}
			_ = apiServer.Client.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: v1alpha1.CredentialSecretName(vmName)}, s)
			return s.OwnerReferences
		}).WithTimeout(30 * time.Second).Should(ContainElement(HaveField("Name", vmName)))
	})

	It("lets the webhook, as its ServiceAccount, admit an opted-in VM and write its Secret", func() {
		// The BSLS is Ready as its server pod would make it (none runs here).
		bsls := &v1alpha1.BackupStorageLocationServer{}
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "main"}, bsls)).To(Succeed())
		bsls.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "ready", LastTransitionTime: metav1.Now()}}
		Expect(apiServer.Client.Status().Update(ctx, bsls)).To(Succeed())

		opts := webhook.Cache()
		opts.Scheme = apiServer.Scheme
		informers, err := cache.New(webhookConfig, opts)
		Expect(err).NotTo(HaveOccurred())
		cacheCtx, stop := context.WithCancel(ctx)
		DeferCleanup(stop)
		go func() { _ = informers.Start(cacheCtx) }()
		Expect(informers.WaitForCacheSync(ctx)).To(BeTrue())
		webhookClient := clientAs(webhookConfig)
		h := mutate.NewHandler(informers, webhookClient, webhookClient, nil)

		vm := &kubevirtv1.VirtualMachine{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
			ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: vmNS, Annotations: map[string]string{v1alpha1.AnnotationServer: bsNS + "/main"}},
			Spec:       kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		}
		raw, err := json.Marshal(vm)
		Expect(err).NotTo(HaveOccurred())
		resp := h.Handle(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "rbac", Kind: metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"},
			Name: "db", Namespace: vmNS, Operation: admissionv1.Create, Object: k8sruntime.RawExtension{Raw: raw},
		}})
		Expect(resp.Allowed).To(BeTrue(), "%+v", resp.Result)
		Expect(resp.Patches).NotTo(BeEmpty())
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: v1alpha1.CredentialSecretName("db")}, &corev1.Secret{})).To(Succeed())
	})

	It("caches only guestbackup's Secrets in the controller, and reads others uncached", func() {
		// An admin's S3 credentials beside a Secret guestbackup manages.
		foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3-credentials", Namespace: bsNS}, Data: map[string][]byte{"AWS_SECRET_ACCESS_KEY": []byte("admin's key")}}
		managed := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cache-probe", Namespace: bsNS, Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}}}
		for _, s := range []*corev1.Secret{foreign, managed} {
			Expect(apiServer.Client.Create(ctx, s)).To(Succeed())
		}
		// The cache cmd/controller runs with, as the controller's ServiceAccount.
		opts := controller.Cache()
		opts.Scheme = apiServer.Scheme
		informers, err := cache.New(controllerConfig, opts)
		Expect(err).NotTo(HaveOccurred())
		cacheCtx, stop := context.WithCancel(ctx)
		DeferCleanup(stop)
		go func() { _ = informers.Start(cacheCtx) }()
		Expect(informers.WaitForCacheSync(ctx)).To(BeTrue())

		Eventually(func() error { return informers.Get(ctx, client.ObjectKeyFromObject(managed), &corev1.Secret{}) }).Should(Succeed())
		cached := &corev1.SecretList{}
		Expect(informers.List(ctx, cached)).To(Succeed())
		Expect(cached.Items).NotTo(BeEmpty())
		for _, s := range cached.Items {
			Expect(s.Labels).To(HaveKeyWithValue(v1alpha1.LabelManagedBy, v1alpha1.ManagedByValue), "cached Secret %s/%s", s.Namespace, s.Name)
		}
		Expect(apierrors.IsNotFound(informers.Get(ctx, client.ObjectKeyFromObject(foreign), &corev1.Secret{}))).To(BeTrue(), "the admin's Secret is not cached")
		// The BSLS reconciler reads it around the cache (Reconciler.APIReader).
		Expect(clientAs(controllerConfig).Get(ctx, client.ObjectKeyFromObject(foreign), &corev1.Secret{})).To(Succeed())
	})

	It("lets only guestbackup's ServiceAccounts write Secrets labelled managed-by: guestbackup", func() {
		const team = "team-a"
		Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: team}})).To(Succeed())
		// A tenant: every verb on Secrets in her namespace, nothing else.
		Expect(apiServer.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: team},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{rbacv1.VerbAll}}},
		})).To(Succeed())
		Expect(apiServer.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: team},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
		})).To(Succeed())
		aliceConfig := rest.CopyConfig(apiServer.Config)
		aliceConfig.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"system:authenticated"}}
		alice, controller, webhook := clientAs(aliceConfig), clientAs(controllerConfig), clientAs(webhookConfig)
		credential := func(vm string) *corev1.Secret {
			return testbed.CredentialSecret(team, vm, bsNS+"/main", "a-password-of-the-vm-0123456789", "1")
		}
		denied := func(op string) gtypes.GomegaMatcher {
			return And(
				Satisfy(apierrors.IsForbidden),
				MatchError(ContainSubstring("only guestbackup's controller and webhook may "+op+" Secrets labelled app.kubernetes.io/managed-by=guestbackup; alice may not "+op)),
			)
		}

		By("denying a tenant's labelled Secret, with the policy's message")
		// The API server loads a new policy asynchronously: the first
		// denial is awaited (a forged Secret let through meanwhile is removed).
		Eventually(func() error {
			err := alice.Create(ctx, credential("forged"))
			if err == nil {
				Expect(apiServer.Client.Delete(ctx, credential("forged"))).To(Succeed())
			}
			return err
		}).WithTimeout(30 * time.Second).Should(denied("create"))

		By("leaving her unlabelled Secrets alone, but not letting her label one")
		own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-config", Namespace: team}, Data: map[string][]byte{"k": []byte("v")}}
		Expect(alice.Create(ctx, own)).To(Succeed())
		own.Labels = map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}
		Expect(alice.Update(ctx, own)).To(denied("update"))

		By("letting the webhook's ServiceAccount create one")
		s := credential("db")
		Expect(webhook.Create(ctx, s)).To(Succeed())

		By("denying the tenant any edit of it: relabel, data, delete")
		relabelled := s.DeepCopy()
		relabelled.Labels = map[string]string{"app": "mine"}
		Expect(alice.Update(ctx, relabelled)).To(denied("update"))
		edited := s.DeepCopy()
		edited.Data[v1alpha1.SecretKeyUsername] = []byte("db@team-b")
		Expect(alice.Patch(ctx, edited, client.MergeFrom(s))).To(denied("update"))
		Expect(alice.Delete(ctx, s)).To(denied("delete"))
		got := &corev1.Secret{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKeyFromObject(s), got)).To(Succeed())
		Expect(got.Labels).To(Equal(s.Labels))
		Expect(got.Data).To(Equal(s.Data))

		By("letting the controller's ServiceAccount patch and delete it")
		patched := got.DeepCopy()
		patched.Annotations = map[string]string{"guestbackup.io/probe": "controller"}
		Expect(controller.Patch(ctx, patched, client.MergeFrom(got))).To(Succeed())
		Expect(controller.Delete(ctx, patched)).To(Succeed())
	})

	It("forbids what neither binary needs", func() {
		controller, webhook := clientAs(controllerConfig), clientAs(webhookConfig)
		controllerWatch, err := client.NewWithWatch(controllerConfig, client.Options{Scheme: apiServer.Scheme})
		Expect(err).NotTo(HaveOccurred())
		d := &appsv1.Deployment{}
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "main-server"}, d)).To(Succeed())
		control := &corev1.Secret{}
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "main-control"}, control)).To(Succeed())
		bsls := &v1alpha1.BackupStorageLocationServer{}
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "main"}, bsls)).To(Succeed())
		_, leaseWatchErr := controllerWatch.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(bsNS))
		maintenanceLease := &coordinationv1.Lease{}
		Expect(apiServer.Client.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: maintenancestate.LeaseName("scaled")}, maintenanceLease)).To(Succeed())
		for what, err := range map[string]error{
			"controller lists Leases cluster-wide":           controller.List(ctx, &coordinationv1.LeaseList{}),
			"controller watches Leases of another namespace": leaseWatchErr,
			// It creates each BSLS's maintenance Lease, and the server pods
			// get their right to it from a ClusterRole the controller may
			// bind: it reads and writes no Lease but its own leader
			// election's.
			"controller deletes a Lease":                           controller.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: bsNS}}),
			"controller lists Leases of its own namespace":         controller.List(ctx, &coordinationv1.LeaseList{}, client.InNamespace(ns)),
			"controller reads the maintenance Lease it created":    controller.Get(ctx, client.ObjectKeyFromObject(maintenanceLease), &coordinationv1.Lease{}),
			"controller takes the maintenance Lease it created":    controller.Update(ctx, maintenanceLease.DeepCopy()),
			"controller reads kube-system's Leases":                controller.Get(ctx, types.NamespacedName{Namespace: "kube-system", Name: "kube-scheduler"}, &coordinationv1.Lease{}),
			"controller writes a Role granting Leases":             controller.Create(ctx, leaseRole(bsNS, "lease-writer")),
			"controller binds a ClusterRole but the maintenance's": controller.Create(ctx, clusterRoleBinding(bsNS, "cluster-admin", "main-server")),
			"controller replaces a Secret (update)":                controller.Update(ctx, control),
			"controller replaces a Deployment (update)":            controller.Update(ctx, d),
			"controller reads ServiceAccounts":                     controller.List(ctx, &corev1.ServiceAccountList{}),
			"controller deletes a Service":                         controller.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "main-server", Namespace: bsNS}}),
			"controller deletes a ServiceAccount":                  controller.Delete(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "main-server", Namespace: bsNS}}),
			"controller replaces a Role (update)":                  controller.Update(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "main-server", Namespace: bsNS}}),
			"controller replaces a BSLS (update)":                  controller.Update(ctx, bsls),
			"controller replaces a BSLS's status (update)":         controller.Status().Update(ctx, bsls),
			"controller writes events.k8s.io Events":               controller.Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: bsNS}}),

			"controller deletes a Deployment":        controller.Delete(ctx, d),
			"controller lists nodes":                 controller.List(ctx, &corev1.NodeList{}),
			"controller deletes a claim":             controller.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "main-repository", Namespace: bsNS}}),
			"webhook deletes a Secret":               webhook.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.CredentialSecretName("db"), Namespace: vmNS}}),
			"webhook updates a BSLS's status":        webhook.Status().Update(ctx, &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: bsNS}}),
			"webhook creates a Deployment":           webhook.Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: vmNS}}),
			"webhook reads the server's Deployments": webhook.Get(ctx, types.NamespacedName{Namespace: bsNS, Name: "main-server"}, &appsv1.Deployment{}),
		} {
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: %v", what, err)
		}
	})
})

// leaseRole is a Role in namespace that lets its subjects get and update
// every Lease there.
func leaseRole(namespace, name string) *rbacv1.Role {
	return &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "update"}}},
	}
}

// clusterRoleBinding binds ClusterRole role, in namespace, to the
// ServiceAccount account of namespace.
func clusterRoleBinding(namespace, role, account string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role + "-" + account, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: account, Namespace: namespace}},
	}
}
