package testbed

import (
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Every webhook of KubeVirt's configurations, as virt-operator makes them,
// ends up calling virt-api's loopback URL at its own path, trusting the CA.
func TestPointWebhooksAtVirtAPI(t *testing.T) {
	dir, err := KubeVirtManifests()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := readManifests(filepath.Join(dir, "webhooks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, u := range objs {
		before, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		if err := pointWebhooksAt(u, "https://127.0.0.1:1234", []byte("CA")); err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
		after, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		if len(after) == 0 || len(after) != len(before) {
			t.Fatalf("%s %s: %d webhooks, then %d", u.GetKind(), u.GetName(), len(before), len(after))
		}
		for i, w := range after {
			path, _, _ := unstructured.NestedString(before[i].(map[string]any), "clientConfig", "service", "path")
			cc, _, _ := unstructured.NestedStringMap(w.(map[string]any), "clientConfig")
			if want := "https://127.0.0.1:1234" + path; cc["url"] != want || !strings.HasPrefix(path, "/") {
				t.Errorf("%s webhook %d: url %q, want %q", u.GetName(), i, cc["url"], want)
			}
			if cc["caBundle"] != base64.StdEncoding.EncodeToString([]byte("CA")) || len(cc) != 2 {
				t.Errorf("%s webhook %d: clientConfig %v", u.GetName(), i, cc)
			}
		}
		kinds[u.GetKind()]++
	}
	if kinds["MutatingWebhookConfiguration"] != 2 || kinds["ValidatingWebhookConfiguration"] != 1 {
		t.Errorf("configurations: %v, want virt-api's mutator and validator and the launcher pod mutator", kinds)
	}
	if err := pointWebhooksAt(&unstructured.Unstructured{Object: map[string]any{"kind": "ConfigMap"}}, "x", nil); err == nil {
		t.Error("a ConfigMap was taken for a webhook configuration")
	}
}

// witnessTB is a TB whose cleanups the test runs itself (runCleanups),
// recording what they report as fatal instead of failing the test: the
// way to see a cleanup's check fail.
type witnessTB struct {
	*testing.T
	cleanups ownCleanups
	cleaning bool
	fatal    []string
}

func (w *witnessTB) Cleanup(f func()) { w.cleanups.add(f) }

func (w *witnessTB) Fatalf(format string, args ...any) {
	if !w.cleaning {
		w.T.Fatalf(format, args...)
	}
	w.fatal = append(w.fatal, fmt.Sprintf(format, args...))
}

func (w *witnessTB) runCleanups() {
	w.cleaning = true
	w.cleanups.run()
}

// The test that started KubeVirt fails when the API server created a VM
// virt-api never admitted or an instance virt-controller never started,
// and passes when KubeVirt took its part in everything: KubeVirt's logs
// are checked against the API server's audit log, whichever client wrote.
func TestKubeVirtWitnessesEveryVMAndInstance(t *testing.T) {
	ctx := context.Background()
	// envtest logs through controller-runtime's global logger.
	ctrllog.SetLogger(logr.Discard())
	w := &witnessTB{T: t}
	// The test's folders go after the processes in them.
	_ = t.TempDir()
	t.Cleanup(w.runCleanups)
	api := StartAPIServer(w, APIServerOptions{})
	kv := StartKubeVirt(w, api)
	c := api.Client
	vm := func(name string, rs kubevirtv1.VirtualMachineRunStrategy) *kubevirtv1.VirtualMachine {
		return &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &rs, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{
					Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
				}},
			}},
		}
	}
	// KubeVirt logs a moment after the API server answered.
	witnessed := func() error {
		var err error
		_ = WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
			err = kv.Witnessed()
			return err == nil, nil
		})
		return err
	}

	if err := c.Create(ctx, vm("started", kubevirtv1.RunStrategyAlways)); err != nil {
		t.Fatal(err)
	}
	if err := WaitFor(time.Minute, 100*time.Millisecond, func() (bool, error) {
		return c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "started"}, &kubevirtv1.VirtualMachineInstance{}) == nil, nil
	}); err != nil {
		t.Fatalf("virt-controller made no instance of VM default/started: %v", err)
	}
	if err := witnessed(); err != nil {
		t.Fatalf("KubeVirt took its part, yet: %v", err)
	}
	if e, ok, err := kv.Admission("default", "started"); err != nil || !ok || e.Level != "info" {
		t.Errorf("virt-api's admission of default/started: %v %v %v", e, ok, err)
	}
	if e, ok, err := kv.Start("default", "started"); err != nil || !ok || e.Name != "started" {
		t.Errorf("virt-controller's start of default/started: %v %v %v", e, ok, err)
	}

	// Behind KubeVirt's back: without its webhook configurations (once
	// the API server no longer calls virt-api: a dry run comes back
	// without virt-api's defaults), a VM is stored unseen, and an admin
	// writes an instance.
	for _, cfg := range []client.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "virt-api-mutator"}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "virt-api-validator"}},
	} {
		if err := c.Delete(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
		probe := vm("probe", kubevirtv1.RunStrategyHalted)
		if err := c.Create(ctx, probe, client.DryRunAll); err != nil {
			return false, err
		}
		return probe.Spec.Template.Spec.Domain.Firmware == nil, nil
	}); err != nil {
		t.Fatalf("the API server still calls virt-api: %v", err)
	}
	if err := c.Create(ctx, vm("unseen", kubevirtv1.RunStrategyHalted)); err != nil {
		t.Fatal(err)
	}
	forged := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "forged", Namespace: "default"}}
	if err := c.Create(ctx, forged); err != nil {
		t.Fatal(err)
	}
	err := WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
		err := kv.Witnessed()
		return err != nil && strings.Contains(err.Error(), "forged"), err
	})
	if err != nil {
		t.Fatalf("the witness never saw the forged instance: %v", err)
	}

	w.runCleanups()
	msg := strings.Join(w.fatal, "\n")
	t.Logf("the cleanup failed the test with: %s", msg)
	for _, want := range [][2]string{
		{"VirtualMachine default/unseen (by ", ") was created, but virt-api's log has no admission of it"},
		{"VirtualMachineInstance default/forged (by ", ") was created by someone other than virt-controller"},
	} {
		if _, after, ok := strings.Cut(msg, want[0]); !ok || !strings.Contains(after, want[1]) {
			t.Errorf("the cleanup's failure does not say %q...%q:\n%s", want[0], want[1], msg)
		}
	}
	for _, seen := range []string{"default/started", "default/probe"} {
		if strings.Contains(msg, seen) {
			t.Errorf("the cleanup's failure names %s, which KubeVirt saw (or which was a dry run):\n%s", seen, msg)
		}
	}
}
