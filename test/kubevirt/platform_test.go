package kubevirt

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// backupPlatform is guestbackup on the test bed with an admin's BSLS,
// <namespace>/main, whose server runs from the Deployment the controller
// writes for it.
type backupPlatform struct {
	*local.Platform
	bsls *v1alpha1.BackupStorageLocationServer
	// port is the server's port on the host's loopback.
	port int
}

// startBackupPlatform starts guestbackup, creates the namespaces (the
// BSLS's first), all labelled as the BSLS admits them, and the BSLS, and
// serves it for the whole container (a pod started in an It would stop
// with it). The server's port on the host's loopback is fixed before the
// BSLS exists: the guest reaches it as 10.0.2.2:<port> (qemu's user
// network), which is the BSLS's clientURL, as for a VM on a secondary
// network that cannot resolve the Service's name.
func startBackupPlatform(ctx context.Context, bslsNamespace string, namespaces ...string) backupPlatform {
	GinkgoHelper()
	return startBackupPlatformWith(ctx, local.Options{Logger: GinkgoLogr}, bslsNamespace, namespaces...)
}

// startBackupPlatformWith is startBackupPlatform with the platform's
// options, e.g. another controller configuration.
func startBackupPlatformWith(ctx context.Context, o local.Options, bslsNamespace string, namespaces ...string) backupPlatform {
	GinkgoHelper()
	port, err := testbed.FreePorts(2)
	Expect(err).NotTo(HaveOccurred())
	p := local.Start(GinkgoT(), o)
	for _, ns := range append([]string{bslsNamespace}, namespaces...) {
		Expect(p.API.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"backup": "allowed"}}})).To(Succeed())
	}
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: bslsNamespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage:   v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access:    v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}}},
			ClientURL: fmt.Sprintf("https://%s:%d", testbed.GuestHostAddress, port),
		},
	}
	Expect(p.API.Client.Create(ctx, bsls)).To(Succeed())
	_, err = p.ServeBSLS(ctx, GinkgoT(), bsls, port)
	Expect(err).NotTo(HaveOccurred())
	return backupPlatform{Platform: p, bsls: bsls, port: port}
}

// readyBSLS creates the namespaces (the BSLS's first), labelled as the BSLS
// admits them, and the BSLS <bslsNamespace>/main with the status a Ready BSLS
// has (the BSLS controller's own specs prove it writes exactly these
// fields), served by nothing: for specs of admission alone, where no
// controller runs to rewrite the status.
func readyBSLS(ctx context.Context, api *testbed.APIServer, bslsNamespace string, namespaces ...string) *v1alpha1.BackupStorageLocationServer {
	GinkgoHelper()
	for _, ns := range append([]string{bslsNamespace}, namespaces...) {
		Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"backup": "allowed"}}})).To(Succeed())
	}
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: bslsNamespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}}},
		},
	}
	Expect(api.Client.Create(ctx, bsls)).To(Succeed())
	ca, err := pki.NewCA("admission spec CA", time.Hour)
	Expect(err).NotTo(HaveOccurred())
	bsls.Status = v1alpha1.BackupStorageLocationServerStatus{
		Endpoint: fmt.Sprintf("https://main.%s.svc:51515", bslsNamespace), TLSCA: string(ca.CertPEM()),
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "ready", LastTransitionTime: metav1.Now()}},
	}
	Expect(api.Client.Status().Update(ctx, bsls)).To(Succeed())
	return bsls
}

// eventsOfVM returns the Events about VM namespace/name on p, as
// local.Platform.Events writes them, for Eventually.
func eventsOfVM(ctx context.Context, p *local.Platform, namespace, name string) func() ([]string, error) {
	return func() ([]string, error) { return p.Events(ctx, namespace, "VirtualMachine", name) }
}
