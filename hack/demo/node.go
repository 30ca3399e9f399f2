package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// nodeTimeout bounds each wait of the real-node demo: a pod runs within
// seconds of being bound, but a busy machine is slow.
const nodeTimeout = 3 * time.Minute

// demoNode narrates the product installed by helm on the test bed's real
// node: the controller, the webhook and the BSLS's server are real pods
// the kubelet runs from `make image`'s image. cert-manager runs in this
// process; KubeVirt does not run (a started VM would need virt-handler and
// virt-launcher on the node), so a kopia client on this machine plays the
// VM's guest, with the credentials the webhook injected.
func demoNode(ctx context.Context, r *run) error {
	start := time.Now()
	r.logger()
	const release, namespace = "guestbackup", "guestbackup-system"
	r.step("Building the image as `make image` does (no container engine), starting a cluster with one real node: "+
		"kube-apiserver and etcd, kube-scheduler, kube-controller-manager, a kubelet and containerd with runc and a CNI bridge; cert-manager's controllers in this process; "+
		"then, as an admin: helm install %s charts/guestbackup -n %s --set image.repository=guestbackup,image.tag=demo,image.pullPolicy=Never", release, namespace)
	node := testbed.InstallChart(r, testbed.ChartInstall{Repository: "guestbackup", Tag: "demo", Release: release, Namespace: namespace})
	r.say("node %s is Ready; pods get addresses in %s on its bridge", node.Name, node.PodCIDR)
	if err := waitPods(ctx, node, namespace, map[string]string{"app.kubernetes.io/instance": release}, 3, r); err != nil {
		return err
	}
	r.done()

	c := node.API.Client
	r.step("Admin: creating BackupStorageLocationServer %s/main on a fresh local volume (root-owned, as a provisioner hands one out)", bslsNamespace)
	node.LocalVolume(r, "repository", "local", "10Gi")
	for _, ns := range []string{bslsNamespace, vmNamespace} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"guestbackup.io/allowed": "true"}}}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: bslsNamespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To("local")}},
			Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"guestbackup.io/allowed": "true"}}},
		},
	}
	if err := c.Create(ctx, bsls); err != nil {
		return fmt.Errorf("create the BSLS: %w", err)
	}
	err := testbed.WaitFor(nodeTimeout, time.Second, func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(bsls), bsls); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(bsls.Status.Conditions, v1alpha1.ConditionReady), nil
	})
	if err != nil {
		return fmt.Errorf("BSLS did not become Ready: %w; its conditions: %v", err, bsls.Status.Conditions)
	}
	serverLabels := map[string]string{"app.kubernetes.io/name": "guestbackup-server", "guestbackup.io/bsls": bsls.Name}
	if err := waitPods(ctx, node, bslsNamespace, serverLabels, 1, r); err != nil {
		return err
	}
	r.say("Ready: endpoint %s (no cluster DNS here: the guest below uses the pod's IP), TLS fingerprint %s", bsls.Status.Endpoint, bsls.Status.TLSFingerprint)
	r.done()

	r.step("Owner: creating VirtualMachine %s/%s with annotation %s=%s/%s (KubeVirt does not run on this cluster: no virt-api admits the VM, and it is never started, since no KubeVirt node agent could run it here yet)",
		vmNamespace, vmName, v1alpha1.AnnotationServer, bslsNamespace, bsls.Name)
	vm := ownersVM(bsls)
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyHalted)
	// The webhook pods' endpoints may reach the API server's routing a
	// moment after the pods are Ready; the webhook fails closed meanwhile.
	if err := testbed.WaitFor(nodeTimeout, 2*time.Second, func() (bool, error) {
		err := c.Create(ctx, vm)
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("create the VirtualMachine: %w", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
		return err
	}
	r.say("the API server called the webhook pod through its Service's endpoints; it injected: %s", vm.Annotations[v1alpha1.AnnotationStatus])
	r.done()

	r.step("The guest's part, played by a kopia client on this machine with the VM's injected credentials, over the node's bridge to the server pod")
	ip, err := node.PodIP(bslsNamespace, serverLabels)
	if err != nil {
		return err
	}
	secret := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName(vmName)}, secret); err != nil {
		return err
	}
	password := string(secret.Data[v1alpha1.SecretKeyPassword])
	guest := testbed.NewKopiaClient(r)
	url := "https://" + testbed.Addr(ip, v1alpha1.DefaultServerPort)
	var out string
	if err := testbed.WaitFor(nodeTimeout, 2*time.Second, func() (bool, error) {
		out, err = guest.ConnectPinned(ctx, url, bsls.Status.TLSFingerprint, vmName+"@"+vmNamespace, password)
		return err == nil, fmt.Errorf("%w: %s", err, out)
	}); err != nil {
		return err
	}
	data := filepath.Join(r.TempDir(), "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(data, "notes.txt"), []byte("backed up through a real pod\n"), 0o600); err != nil {
		return err
	}
	if out, err := guest.RunWithPassword(ctx, password, "snapshot", "create", data); err != nil {
		return fmt.Errorf("snapshot: %w: %s", err, out)
	}
	list, err := guest.RunWithPassword(ctx, password, "snapshot", "list", "--all")
	if err != nil {
		return fmt.Errorf("snapshot list: %w: %s", err, list)
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		r.say("%s", line)
	}
	r.done()
	fmt.Fprintf(r.out, "\nReal pods: the controller, the webhook and the server (run by the kubelet). In this process: cert-manager. Played: the guest. "+
		"The whole demo took %v; stopping everything.\n", time.Since(start).Round(time.Second))
	return nil
}

// waitPods waits until want pods matching labels in namespace are Ready,
// and names them, their node and the user they run as.
func waitPods(ctx context.Context, node *testbed.Node, namespace string, labels map[string]string, want int, r *run) error {
	var pods corev1.PodList
	err := testbed.WaitFor(nodeTimeout, time.Second, func() (bool, error) {
		if err := node.API.Client.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
			return false, err
		}
		ready := 0
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == want, fmt.Errorf("%d of %d pods Ready in %s", ready, want, namespace)
	})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		r.say("real pod %s/%s on node %s, IP %s, Ready", p.Namespace, p.Name, p.Spec.NodeName, p.Status.PodIP)
	}
	return nil
}
