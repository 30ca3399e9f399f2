package kopiaserver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// BenchmarkSecretToAuthentication measures the whole provisioning path, for
// 20 VMs one after another: from creating a VM's credential Secret (as the
// webhook does) to the first successful `kopia repository connect server`
// with it. In between: the controller hashes the password (scrypt, once),
// writes the users Secret, the server pod's user-sync applies the user and
// refreshes the server. The real kopia client's own run time is included.
// Reports p50 and p95; target p95 <= 3 s.
func BenchmarkSecretToAuthentication(b *testing.B) {
	const (
		ns    = "bench"
		name  = "main"
		users = 20
	)
	ctx := context.Background()
	api := testbed.StartAPIServer(b, testbed.APIServerOptions{})
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	stop, err := runController(api, testbed.ManagerOptions{Logger: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := stop(); err != nil {
			b.Error(err)
		}
	})
	bsls := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
	}
	if err := api.Client.Create(ctx, bsls); err != nil {
		b.Fatal(err)
	}
	deployment := &appsv1.Deployment{}
	key := types.NamespacedName{Namespace: ns, Name: kopiaserver.DeploymentName(bsls)}
	if err := testbed.WaitFor(time.Minute, 100*time.Millisecond, func() (bool, error) {
		err := api.Client.Get(ctx, key, deployment)
		return err == nil, err
	}); err != nil {
		b.Fatalf("the controller wrote no Deployment: %v", err)
	}
	pod := testbed.RunPod(b, testbed.PodOptions{
		Namespace: ns,
		Spec:      deployment.Spec.Template.Spec,
		Binaries:  serverBinaries(b),
		Claims:    map[string]string{kopiaserver.ClaimName(bsls): b.TempDir()},
		API:       api,
	})
	if err := pod.WaitReady(2 * time.Minute); err != nil {
		b.Fatal(err)
	}
	if err := api.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(bsls), bsls); err != nil {
		b.Fatal(err)
	}
	if !meta.IsStatusConditionTrue(bsls.Status.Conditions, v1alpha1.ConditionCertificateReady) {
		b.Fatalf("no certificate: %+v", bsls.Status.Conditions)
	}
	url, pin := "https://"+pod.Addr(v1alpha1.DefaultServerPort), bsls.Status.TLSFingerprint

	var latencies []time.Duration
	n := 0
	for b.Loop() {
		for range users {
			vm := fmt.Sprintf("vm-%03d", n)
			n++
			password := testbed.RandomPassword()
			start := time.Now()
			if err := createCredential(ctx, api, credentialSecret(vm, ns, ns, name, password, "1")); err != nil {
				b.Fatal(err)
			}
			err := testbed.WaitFor(30*time.Second, 50*time.Millisecond, func() (bool, error) {
				_, err := testbed.NewKopiaClient(b).ConnectPinned(ctx, url, pin, vm+"@"+ns, password)
				return err == nil, err
			})
			if err != nil {
				b.Fatalf("%s never authenticated: %v", vm, err)
			}
			latencies = append(latencies, time.Since(start))
		}
	}
	b.ReportMetric(testbed.Percentile(latencies, 50).Seconds(), "p50-s")
	b.ReportMetric(testbed.Percentile(latencies, 95).Seconds(), "p95-s")
	b.ReportMetric(float64(len(latencies)), "users")
}
