package node

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// The specs share one install and build on each other, as an admin and a
// VM owner would use it: the release's pods, then a BSLS, then a VM, then
// its guest.
var _ = Describe("guestbackup on a real node", Ordered, func() {
	const (
		bslsNamespace = "backup"
		vmNamespace   = "vms"
		storageClass  = "node-local"
		// serverUID is the image's user (Dockerfile, hack/image.sh).
		serverUID = 65532
	)
	var (
		bsls     *v1alpha1.BackupStorageLocationServer
		claimDir string
		// web is the first VM's user and password, and the folder its guest
		// snapshotted.
		web struct{ user, password, data string }
		// db is the second VM's user and password.
		db struct{ user, password string }
		// guestData holds what the guests snapshot, for all the specs.
		guestData string
	)
	BeforeAll(func() { guestData = GinkgoT().TempDir() })
	// provisioned waits until the controller pod gave VM name's user to
	// the server, and returns the user and the password the webhook pod
	// issued it.
	provisioned := func(name string) (user, password string) {
		GinkgoHelper()
		c := node.API.Client
		user = name + "@" + vmNamespace
		Eventually(func() string {
			s := &corev1.Secret{}
			key := types.NamespacedName{Namespace: bslsNamespace, Name: userset.SecretName(bsls.Name, userset.ShardOf(user))}
			if err := c.Get(ctx, key, s); err != nil {
				return err.Error()
			}
			return string(s.Data[userset.Key])
		}).WithTimeout(podTimeout).Should(ContainSubstring(user+" "), "the controller pod provisioned %s", user)
		secret := &corev1.Secret{}
		Expect(c.Get(ctx, types.NamespacedName{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName(name)}, secret)).To(Succeed())
		password = string(secret.Data[v1alpha1.SecretKeyPassword])
		Expect(password).NotTo(BeEmpty())
		return user, password
	}
	// connect connects a fresh kopia client, playing a guest, to the server
	// pod at its IP on the node's bridge, pinned to the BSLS's CA, as user.
	connect := func(user, password string) (*testbed.KopiaClient, error) {
		ip, err := node.PodIP(bslsNamespace, map[string]string{"app.kubernetes.io/name": "guestbackup-server", "guestbackup.io/bsls": bsls.Name})
		if err != nil {
			return nil, err
		}
		guest := testbed.NewKopiaClient(GinkgoT())
		out, err := guest.ConnectPinned(ctx, "https://"+testbed.Addr(ip, v1alpha1.DefaultServerPort), bsls.Status.TLSFingerprint, user, password)
		if err != nil {
			return nil, fmt.Errorf("%w: %s", err, out)
		}
		return guest, nil
	}
	// connected is connect once the server pod's user sync has applied
	// the user (within seconds).
	connected := func(user, password string) *testbed.KopiaClient {
		GinkgoHelper()
		var guest *testbed.KopiaClient
		Eventually(func() (err error) {
			guest, err = connect(user, password)
			return err
		}).WithTimeout(podTimeout).WithPolling(2 * time.Second).Should(Succeed())
		return guest
	}
	// createVM creates VM name of vmNamespace, opted in to the BSLS, through
	// the webhook pod.
	createVM := func(name string) *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		// Never started: no KubeVirt runs here (see the package doc).
		vm := testbed.SmallVM(vmNamespace, name, map[string]string{v1alpha1.AnnotationServer: bslsNamespace + "/" + bsls.Name})
		Expect(node.API.Client.Create(ctx, vm)).To(Succeed())
		Expect(node.API.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)).To(Succeed())
		Expect(vm.Annotations).To(HaveKey(v1alpha1.AnnotationStatus), "the webhook pod injected VM %s", name)
		return vm
	}
	// snapshot writes a file into a fresh folder of guestData and
	// snapshots it as guest.
	snapshot := func(guest *testbed.KopiaClient, password, content string) (data string, ids []string) {
		GinkgoHelper()
		data, err := os.MkdirTemp(guestData, "data-")
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(data, "config"), []byte(content), 0o600)).To(Succeed())
		out, err := guest.RunWithPassword(ctx, password, "snapshot", "create", data)
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		ids, err = guest.SnapshotIDs(ctx, data)
		Expect(err).NotTo(HaveOccurred())
		return data, ids
	}

	AfterEach(func() {
		if CurrentSpecReport().Failed() {
			node.LogContainers(GinkgoT(), 40)
		}
	})

	It("runs the controller and the webhook as pods the kubelet made Ready", func() {
		Eventually(func(g Gomega) {
			pods := podsOf(g, releaseNamespace, map[string]string{"app.kubernetes.io/instance": release})
			g.Expect(pods).To(HaveLen(3), "one controller and two webhook pods")
			for _, p := range pods {
				g.Expect(p.Spec.NodeName).To(Equal(node.Name))
				g.Expect(isPodReady(p)).To(BeTrue(), "pod %s Ready: %s", p.Name, testbed.DescribePod(&p))
			}
		}).WithTimeout(podTimeout).WithPolling(2 * time.Second).Should(Succeed())
	})

	It("runs a BSLS's server pod as the image's user on a fresh root-owned claim, under fsGroup", func() {
		// A fresh folder, root-owned 0755, as a provisioner hands out a new
		// claim's root directory. The kubelet applies fsGroup to local
		// volumes as to block-backed CSI ones.
		claimDir = node.LocalVolume(GinkgoT(), "repository", storageClass, "10Gi")
		c := node.API.Client
		Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: bslsNamespace}})).To(Succeed())
		bsls = &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: bslsNamespace},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{
					Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To(storageClass)}},
				Access: v1alpha1.AccessSpec{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"guestbackup.io/backup": "enabled"}},
					AppendOnly:        true,
				},
				Repository: v1alpha1.RepositorySpec{PathPrefix: "guests"},
			},
		}
		Expect(c.Create(ctx, bsls)).To(Succeed())

		serverLabels := map[string]string{"app.kubernetes.io/name": "guestbackup-server", "guestbackup.io/bsls": bsls.Name}
		Eventually(func(g Gomega) {
			g.Expect(c.Get(ctx, client.ObjectKeyFromObject(bsls), bsls)).To(Succeed())
			var pods []string
			for _, p := range podsOf(g, bslsNamespace, serverLabels) {
				pods = append(pods, p.Name+" "+testbed.DescribePod(&p))
			}
			g.Expect(meta.IsStatusConditionTrue(bsls.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue(),
				"BSLS Ready; conditions %v; server pods: %s", bsls.Status.Conditions, strings.Join(pods, "; "))
		}).WithTimeout(2 * podTimeout).WithPolling(2 * time.Second).Should(Succeed())

		pods := podsOf(Default, bslsNamespace, serverLabels)
		Expect(pods).To(HaveLen(1))
		pod := pods[0]
		Expect(pod.Spec.NodeName).To(Equal(node.Name))
		Expect(pod.Spec.SecurityContext).NotTo(BeNil())
		Expect(pod.Spec.SecurityContext.FSGroup).NotTo(BeNil(), "the server pod sets fsGroup")
		fsGroup := *pod.Spec.SecurityContext.FSGroup
		for _, container := range []string{"kopia", "user-sync"} {
			pid, err := node.ContainerPID(&pod, container)
			Expect(err).NotTo(HaveOccurred())
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			Expect(err).NotTo(HaveOccurred())
			Expect(statusField(status, "Uid")).To(HaveExactElements(strconv.Itoa(serverUID), strconv.Itoa(serverUID), strconv.Itoa(serverUID), strconv.Itoa(serverUID)), "container %s's user", container)
			Expect(statusField(status, "Groups")).To(ContainElement(strconv.FormatInt(fsGroup, 10)), "container %s's groups", container)
		}
		By("the kubelet gave the claim's root to fsGroup, and the repository was written there, under the path prefix")
		var st syscall.Stat_t
		Expect(syscall.Stat(claimDir, &st)).To(Succeed())
		Expect(int64(st.Gid)).To(Equal(fsGroup))
		Expect(filepath.Join(claimDir, "guests", "kopia.repository.f")).To(BeAnExistingFile())
	})

	It("injects an annotated VM through the webhook pod, which the API server calls through its Service", func() {
		c := node.API.Client
		Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vmNamespace,
			Labels: map[string]string{"guestbackup.io/backup": "enabled"}}})).To(Succeed())
		// The API server routes to the webhook Service's endpoints: wait
		// until they list both webhook pods, so that the one create below
		// is admitted by a webhook call that completes.
		Eventually(func(g Gomega) {
			var endpointSlices discoveryv1.EndpointSliceList
			g.Expect(c.List(ctx, &endpointSlices, client.InNamespace(releaseNamespace))).To(Succeed())
			ready := 0
			for _, s := range endpointSlices.Items {
				if s.Labels[discoveryv1.LabelServiceName] != release+"-webhook" {
					continue
				}
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ready++
					}
				}
			}
			g.Expect(ready).To(Equal(2), "ready endpoints of the webhook Service")
		}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
		vm := createVM("web")
		Expect(slices.ContainsFunc(vm.Spec.Template.Spec.Volumes, func(v kubevirtv1.Volume) bool {
			return v.CloudInitNoCloud != nil && v.CloudInitNoCloud.UserDataSecretRef != nil
		})).To(BeTrue(), "a cloudInitNoCloud volume with the credentials' Secret")
		web.user, web.password = provisioned("web")
	})

	It("lets a guest connect to the server pod over the node's network, with its own password only, and snapshot", func() {
		ip, err := node.PodIP(bslsNamespace, map[string]string{"app.kubernetes.io/name": "guestbackup-server", "guestbackup.io/bsls": bsls.Name})
		Expect(err).NotTo(HaveOccurred())
		Expect(node.PodCIDR.Contains(net.ParseIP(ip))).To(BeTrue(), "pod IP %s on the node's bridge", ip)
		Expect(node.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), bsls)).To(Succeed())
		guest := connected(web.user, web.password)
		_, err = connect(web.user, "not the password")
		Expect(err).To(MatchError(ContainSubstring("access denied")))
		var ids []string
		web.data, ids = snapshot(guest, web.password, "kept\n")
		Expect(ids).To(HaveLen(1))
	})

	It("runs the repository's maintenance in the server pod, as guestbackup's owner, and reports it in the BSLS's status", func() {
		// A new repository has a full cycle due at once.
		Eventually(func(g Gomega) {
			b := &v1alpha1.BackupStorageLocationServer{}
			g.Expect(node.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), b)).To(Succeed())
			m := b.Status.Maintenance
			g.Expect(m).NotTo(BeNil())
			g.Expect(m.Owner).To(Equal("guestbackup-maintenance@main." + bslsNamespace))
			g.Expect(m.LastCycle).To(Equal("full"))
			g.Expect(m.LastSuccess).NotTo(BeNil())
			g.Expect(m.NextRun).NotTo(BeNil())
			g.Expect(m.Failure).To(BeEmpty())
		}).WithTimeout(podTimeout).WithPolling(2 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			var events corev1.EventList
			g.Expect(node.API.Client.List(ctx, &events, client.InNamespace(bslsNamespace))).To(Succeed())
			var reasons []string
			for _, e := range events.Items {
				reasons = append(reasons, e.Reason)
			}
			g.Expect(reasons).To(ContainElement("MaintenanceOwnerClaimed"), "the server pod's Event")
		}).WithTimeout(podTimeout).Should(Succeed())
	})

	It("lets an append-only guest create and read its snapshots, but not delete them or change their retention", func() {
		guest := connected(web.user, web.password)
		ids, err := guest.SnapshotIDs(ctx, web.data)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		out, err := guest.RunWithPassword(ctx, web.password, "snapshot", "delete", ids[0], "--delete")
		Expect(err).To(HaveOccurred(), "an append-only guest deleted its snapshot: %s", out)
		Expect(out).To(ContainSubstring("access denied"))
		Expect(guest.SnapshotIDs(ctx, web.data)).To(Equal(ids))
		out, err = guest.RunWithPassword(ctx, web.password, "snapshot", "verify")
		Expect(err).NotTo(HaveOccurred(), out)

		By("keeping retention the admin's: the server applies a source's policy after each snapshot")
		out, err = guest.RunWithPassword(ctx, web.password, "policy", "set", web.data, "--keep-latest=1", "--keep-hourly=0", "--keep-daily=0", "--keep-weekly=0", "--keep-monthly=0", "--keep-annual=0")
		Expect(err).To(HaveOccurred(), "an append-only guest changed its retention: %s", out)
		Expect(out).To(ContainSubstring("access denied"))
		out, err = guest.RunWithPassword(ctx, web.password, "snapshot", "create", web.data)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(guest.SnapshotIDs(ctx, web.data)).To(HaveLen(2))
	})

	It("hashes a new VM's password as the BSLS now asks (PBKDF2), serves both kinds, and keeps the two VMs' snapshots apart", func() {
		patch := client.MergeFrom(bsls.DeepCopy())
		bsls.Spec.Access.PasswordHash = v1alpha1.PasswordHashPBKDF2
		Expect(node.API.Client.Patch(ctx, bsls, patch)).To(Succeed())
		createVM("db")
		db.user, db.password = provisioned("db")
		guest := connected(db.user, db.password)
		data, ids := snapshot(guest, db.password, "db's own\n")
		Expect(ids).To(HaveLen(1))
		out, err := guest.RunWithPassword(ctx, db.password, "snapshot", "list", "--all")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(data))
		Expect(out).NotTo(ContainSubstring(web.data), "the first VM's snapshots")
		Expect(connect(web.user, web.password)).Error().NotTo(HaveOccurred(), "the first VM's scrypt hash still serves")
	})

	It("takes a rotated password at once for a VM that does not run: the old one is refused, the new one accepted", func() {
		vm := &kubevirtv1.VirtualMachine{}
		Expect(node.API.Client.Get(ctx, types.NamespacedName{Namespace: vmNamespace, Name: "web"}, vm)).To(Succeed())
		patch := client.MergeFrom(vm.DeepCopy())
		vm.Annotations[v1alpha1.AnnotationRotate] = "1"
		Expect(node.API.Client.Patch(ctx, vm, patch)).To(Succeed())
		old := web.password
		Eventually(func() string {
			s := &corev1.Secret{}
			_ = node.API.Client.Get(ctx, types.NamespacedName{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName("web")}, s)
			return string(s.Data[v1alpha1.SecretKeyPassword])
		}).WithTimeout(podTimeout).ShouldNot(Equal(old), "the webhook pod issued a new password")
		_, web.password = provisioned("web")
		Eventually(func() error {
			_, err := connect(web.user, old)
			return err
		}).WithTimeout(podTimeout).WithPolling(2 * time.Second).Should(MatchError(ContainSubstring("access denied")))
		connected(web.user, web.password)
	})

	It("revokes a deleted VM's user", func() {
		Expect(db.password).NotTo(BeEmpty(), "the second VM's password, which its guest used")
		Expect(node.API.Client.Delete(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: vmNamespace}})).To(Succeed())
		Eventually(func() error {
			_, err := connect(db.user, db.password)
			return err
		}).WithTimeout(podTimeout).WithPolling(2 * time.Second).Should(MatchError(ContainSubstring("access denied")))
		connected(web.user, web.password)
	})
})

// podsOf lists the pods matching labels in namespace.
func podsOf(g Gomega, namespace string, labels map[string]string) []corev1.Pod {
	var pods corev1.PodList
	g.Expect(node.API.Client.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels(labels))).To(Succeed())
	return pods.Items
}

func isPodReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// statusField is a field of /proc/PID/status, split into its values.
func statusField(status []byte, name string) []string {
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.Fields(v)
		}
	}
	return nil
}
