package kubevirt

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
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
	port, err := testbed.FreePort()
	Expect(err).NotTo(HaveOccurred())
	p := local.Start(GinkgoT(), local.Options{Logger: GinkgoLogr})
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
