package testbed

import (
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
