package kopiaserver_test

import (
	"context"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// startStorageController is the bed of the specs whose repositories live
// in object storage, for the current container: an API server that serves
// Velero's BackupStorageLocations, with namespaces, and the controller on
// it. It returns the API server and the server pod's binaries.
func startStorageController(ctx context.Context, namespaces ...string) (*testbed.APIServer, map[string]string) {
	GinkgoHelper()
	api := testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{Velero: true})
	for _, name := range namespaces {
		Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	}
	binaries := serverBinaries(GinkgoT())
	startController(api)
	return api, binaries
}

// getBSLS reads BSLS namespace/name from api.
func getBSLS(ctx context.Context, api *testbed.APIServer, namespace, name string) (*v1alpha1.BackupStorageLocationServer, error) {
	b := &v1alpha1.BackupStorageLocationServer{}
	return b, api.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, b)
}

// bslsCondition returns, for Eventually, condition t of BSLS
// namespace/name on api: nil while it has none, or cannot be read.
func bslsCondition(ctx context.Context, api *testbed.APIServer, namespace, name, t string) func() *metav1.Condition {
	return func() *metav1.Condition {
		b, err := getBSLS(ctx, api, namespace, name)
		if err != nil {
			return nil
		}
		return meta.FindStatusCondition(b.Status.Conditions, t)
	}
}

// bslsEvents returns, for Eventually, the Events on BSLS namespace/name on
// api, each as "<type> <reason>: <message>".
func bslsEvents(ctx context.Context, api *testbed.APIServer, namespace, name string) func() []string {
	return func() []string {
		list := &corev1.EventList{}
		if err := api.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return nil
		}
		var out []string
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "BackupStorageLocationServer" && e.InvolvedObject.Name == name {
				out = append(out, e.Type+" "+e.Reason+": "+e.Message)
			}
		}
		return out
	}
}

// veleroBSL is Velero's BackupStorageLocation namespace/name of provider,
// storing in bucket under prefix, with its config and credential (nil: none,
// as Velero installed without a Secret), whose Velero admin lets the BSLSs
// allowed ("<namespace>/<name>") reuse it.
func veleroBSL(namespace, name, provider, bucket, prefix string, config, credential map[string]any, allowed ...string) *unstructured.Unstructured {
	spec := map[string]any{
		"provider":      provider,
		"objectStorage": map[string]any{"bucket": bucket, "prefix": prefix},
		"config":        config,
	}
	if credential != nil {
		spec["credential"] = credential
	}
	bsl := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	bsl.SetGroupVersionKind(kopiaserver.VeleroBSL)
	bsl.SetNamespace(namespace)
	bsl.SetName(name)
	bsl.SetAnnotations(map[string]string{v1alpha1.AnnotationAllowedServers: strings.Join(allowed, ",")})
	return bsl
}

// serverBinaries are the local binaries that stand for the server image's
// commands (kopia for both architectures it serves, guestbackup-server),
// for testbed.RunPod.
func serverBinaries(tb testbed.TB) map[string]string {
	tb.Helper()
	tools := testbed.MustTools(tb)
	return map[string]string{
		kopiaserver.KopiaBinary:       tools.Kopia,
		kopiaserver.ClientBinaryARM64: tools.KopiaARM64,
		kopiaserver.ServerBinary:      testbed.Build(tb, "./cmd/server"),
	}
}

// pausableClock is the controller's clock for specs that must decide when
// its time passes: the real time until Pause, then a time that moves only
// by Step, until Resume.
type pausableClock struct {
	mu     sync.Mutex
	paused *time.Time
}

// Now is the real time, or the paused one.
func (c *pausableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused != nil {
		return *c.paused
	}
	return time.Now()
}

// Since is the time from t to Now.
func (c *pausableClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Pause stops the clock at the real time.
func (c *pausableClock) Pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.paused = &now
}

// Step moves a paused clock on by d.
func (c *pausableClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused != nil {
		t := c.paused.Add(d)
		c.paused = &t
	}
}

// Resume makes the clock tell the real time again.
func (c *pausableClock) Resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paused = nil
}
