// Package cluster is guestbackup on real KubeVirt on the test bed's real
// node: KubeVirt installed from its operator, guestbackup by `helm install`
// of its chart, and an admin's BSLS Ready, for test/cluster and `make demo
// MODE=cluster`.
package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// Options name what Start creates.
type Options struct {
	// Tag names guestbackup's image in the node (guestbackup:<Tag>).
	Tag string
	// BSLSNamespace holds the admin's BSLS, <BSLSNamespace>/main; Namespaces
	// are the VMs'. All are created with NamespaceLabels, which the BSLS
	// selects.
	BSLSNamespace   string
	Namespaces      []string
	NamespaceLabels map[string]string
	// Requests installs the chart with requests.enabled (alpha).
	Requests bool
}

// Backend is guestbackup on real KubeVirt on the test bed's real node, with
// an admin's filesystem BSLS Ready.
type Backend struct {
	Node *testbed.Node
	// Client is the node's admin client, retrying its writes while the API
	// server cannot call KubeVirt's webhooks (testbed.RetryKubeVirtWebhooks).
	Client client.Client
	Images testbed.KubeVirtImages
	BSLS   *v1alpha1.BackupStorageLocationServer
	// ServerURL is the BSLS's clientURL: the address on the node's bridge
	// where guests, behind their launcher pods, and this machine reach its
	// server (ServiceProxy).
	ServerURL string
	// Elapsed is how long Start took.
	Elapsed time.Duration
}

// storageClass is the class of the BSLS's local volume.
const storageClass = "node-local"

// Start installs, on a fresh one-node cluster, KubeVirt from its operator
// (testbed.InstallKubeVirt) and guestbackup with `helm install` of its
// chart (testbed.InstallChart), as an admin does; then creates the namespaces, a
// local volume for the BSLS's claim, and the BSLS, whose clientURL is a
// proxy to its Service (no cluster DNS or kube-proxy runs here), and waits
// until the BSLS is Ready.
func Start(tb testbed.TB, o Options) (*Backend, error) {
	tb.Helper()
	start := time.Now()
	images, err := testbed.LoadKubeVirtImages()
	if err != nil {
		return nil, err
	}
	// The audit's interval as the local bed's (local.ControllerOptions):
	// a guest's snapshot becomes an Event on its VM within seconds.
	values := []string{"controller.guestActivityInterval=2s"}
	if o.Requests {
		values = append(values, "requests.enabled=true")
	}
	node := testbed.InstallChart(tb, testbed.ChartInstall{Repository: "guestbackup", Tag: o.Tag, Release: "guestbackup", Namespace: "guestbackup-system",
		Values: values, KubeVirt: &images})
	b := &Backend{Node: node, Images: images, Client: testbed.RetryKubeVirtWebhooks(node.API.Client, tb.Logf)}
	ctx := context.Background()
	c := b.Client
	for _, ns := range append([]string{o.BSLSNamespace}, o.Namespaces...) {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: o.NamespaceLabels}}); err != nil {
			return nil, fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	node.LocalVolume(tb, "repository", storageClass, "10Gi")
	b.BSLS = &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: o.BSLSNamespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{
				Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To(storageClass)}},
			Access: v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: o.NamespaceLabels}},
		},
	}
	// The server port, and the client port next to it, as guests find it
	// (clientdist.Port): they poll it for requests.
	proxy, err := node.ServiceProxies(tb, o.BSLSNamespace, kopiaserver.ServiceName(b.BSLS), v1alpha1.DefaultServerPort, clientdist.Port(v1alpha1.DefaultServerPort))
	if err != nil {
		return nil, err
	}
	b.ServerURL = "https://" + proxy
	b.BSLS.Spec.ClientURL = b.ServerURL
	if err := c.Create(ctx, b.BSLS); err != nil {
		return nil, fmt.Errorf("create the BSLS: %w", err)
	}
	if err := testbed.WaitFor(6*time.Minute, 2*time.Second, func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(b.BSLS), b.BSLS); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(b.BSLS.Status.Conditions, v1alpha1.ConditionReady), fmt.Errorf("conditions %v", b.BSLS.Status.Conditions)
	}); err != nil {
		return nil, fmt.Errorf("BSLS %s/main did not become Ready: %w\n%s", o.BSLSNamespace, err, testbed.DescribePods(ctx, c, o.BSLSNamespace))
	}
	b.Elapsed = time.Since(start)
	return b, nil
}
