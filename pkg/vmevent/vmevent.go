// Package vmevent is what the webhook and the controllers say to a VM's
// owner: Events on the VirtualMachine, decided by pure functions and
// recorded at the edge.
package vmevent

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// ReasonCredentialsIssued: the VM got new Kopia credentials. The webhook
// records it at an update; at a VM's creation the VM reconciler does, once
// the VM has a UID (vmsecret.AnnotationIssuedEvent).
const ReasonCredentialsIssued = "CredentialsIssued"

// Event is one Event to record on a VM.
type Event struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type string
	// Reason is one of the documented Reason constants of the package
	// that decided it (docs/events.md).
	Reason string
	// Message is for the VM's owner; it never holds a secret.
	Message string
}

// Record records events on the VM m names. It refers to the VM by its
// metadata rather than by a stored object, because on CREATE admission the
// VM has no UID yet; kubectl describe shows only Events with the VM's UID,
// so what a VM's owner must see at its creation is recorded once it exists
// (see ReasonCredentialsIssued). A nil recorder records nothing.
func Record(recorder record.EventRecorder, m metav1.ObjectMeta, events []Event) {
	if recorder == nil || len(events) == 0 {
		return
	}
	vm := &kubevirtv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID},
	}
	for _, e := range events {
		recorder.Event(vm, e.Type, e.Reason, e.Message)
	}
}

// Normal is an Event of type Normal: something the owner may want to know.
func Normal(reason, message string) Event {
	return Event{Type: corev1.EventTypeNormal, Reason: reason, Message: message}
}

// Warning is an Event of type Warning: something the owner must act on.
func Warning(reason, message string) Event {
	return Event{Type: corev1.EventTypeWarning, Reason: reason, Message: message}
}
