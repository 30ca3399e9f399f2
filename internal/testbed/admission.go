package testbed

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// VMUpdateReview is the AdmissionReview the API server sends a mutating
// webhook for an update of the VirtualMachine namespace/name to vm (its
// JSON) from old (nil: none given).
func VMUpdateReview(namespace, name string, vm, old []byte) ([]byte, error) {
	review, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "bench", Kind: metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"},
			Resource: metav1.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"},
			Name:     name, Namespace: namespace, Operation: admissionv1.Update,
			Object: runtime.RawExtension{Raw: vm}, OldObject: runtime.RawExtension{Raw: old},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("encode the review of %s/%s: %w", namespace, name, err)
	}
	return review, nil
}

// AdmitUnchanged posts review to the webhook at url and checks that it
// allowed the object without a patch: the steady state of an admitted VM.
func AdmitUnchanged(c *http.Client, url string, review []byte) error {
	resp, err := c.Post(url, "application/json", bytes.NewReader(review))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return fmt.Errorf("decode the webhook's answer: %w", err)
	}
	if out.Response == nil || !out.Response.Allowed || len(out.Response.Patch) != 0 {
		return fmt.Errorf("want an allowed admission without a patch, got %+v", out.Response)
	}
	return nil
}

// ApplyPatch applies patch (a JSON patch's operations, as a mutating
// webhook answers them) to obj the way the API server does.
func ApplyPatch(obj []byte, patch any) ([]byte, error) {
	ops, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encode the patch: %w", err)
	}
	p, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		return nil, fmt.Errorf("decode the patch %s: %w", ops, err)
	}
	out, err := p.Apply(obj)
	if err != nil {
		return nil, fmt.Errorf("the patch %s does not apply: %w", ops, err)
	}
	return out, nil
}
