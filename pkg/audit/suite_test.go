package audit_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

func TestAudit(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	// controller-runtime's informers log through its global logger.
	ctrl.SetLogger(GinkgoLogr)
	RunSpecs(t, "Guest activity audit, from a real Kopia server to Events on VMs")
}

// startAuditBed starts an API server with the namespaces, the BSLS, and
// the activity and catalogue ConfigMaps its reconciler creates, labelled as it labels
// them (the controller caches only guestbackup's ConfigMaps) and
// controlled by the BSLS (the audit believes no other).
func startAuditBed(ctx context.Context) *testbed.APIServer {
	GinkgoHelper()
	api := testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
	for _, ns := range []string{vmNamespace, bslsNamespace} {
		Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	}
	bsls := createServer(ctx, api, types.NamespacedName{Namespace: bslsNamespace, Name: bslsName})
	names := []string{}
	for shard := range userset.Shards {
		names = append(names, activity.ConfigMapName(bslsName, shard))
	}
	for shard := range activity.CatalogueShards {
		names = append(names, activity.CatalogueConfigMapName(bslsName, shard))
	}
	for _, name := range names {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: bslsNamespace,
			Labels: labels.Merge(kopiaserver.Labels(bsls), map[string]string{activity.Label: bslsName}),
		}}
		Expect(controllerutil.SetControllerReference(bsls, cm, api.Scheme)).To(Succeed())
		Expect(api.Client.Create(ctx, cm)).To(Succeed())
	}
	return api
}

// createServer creates a BSLS as an admin would, as little of it as its
// API's validation accepts: the audit reads no more of it than that it
// exists.
func createServer(ctx context.Context, api *testbed.APIServer, key types.NamespacedName) *v1alpha1.BackupStorageLocationServer {
	GinkgoHelper()
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
	}
	Expect(api.Client.Create(ctx, bsls)).To(Succeed())
	return bsls
}

// createOptedInVM creates VM name of vmNamespace with annotations (the
// server's added) and runStrategy, and its credential Secret as the
// webhook writes it, issued at issuedAt, with password.
func createOptedInVM(ctx context.Context, api *testbed.APIServer, name string, annotations map[string]string, run kubevirtv1.VirtualMachineRunStrategy, issuedAt time.Time, password string) {
	GinkgoHelper()
	annotations[v1alpha1.AnnotationServer] = bslsNamespace + "/" + bslsName
	Expect(api.Client.Create(ctx, &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: vmNamespace, Annotations: annotations},
		Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(run), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
	})).To(Succeed())
	s := testbed.CredentialSecret(vmNamespace, name, bslsNamespace+"/"+bslsName, password, "1")
	s.Annotations[v1alpha1.AnnotationIssuedAt] = issuedAt.Format(time.RFC3339Nano)
	Expect(api.Client.Create(ctx, s)).To(Succeed())
}

// vmEvents returns the Events on VM vm with reason, as "Type message",
// once per occurrence.
func vmEvents(ctx context.Context, api *testbed.APIServer, vm, reason string) func() []string {
	return func() []string {
		list := &corev1.EventList{}
		if err := api.Client.List(ctx, list, client.InNamespace(vmNamespace)); err != nil {
			return nil
		}
		var out []string
		for _, e := range list.Items {
			if e.InvolvedObject.Name == vm && e.Reason == reason {
				for range max(e.Count, 1) {
					out = append(out, e.Type+" "+e.Message)
				}
			}
		}
		return out
	}
}
