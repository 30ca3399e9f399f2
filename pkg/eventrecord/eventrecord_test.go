package eventrecord

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
)

// sink keeps the Events a broadcaster writes, as the API server would.
type sink struct {
	mu     sync.Mutex
	events []string
}

func (s *sink) Create(e *corev1.Event) (*corev1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e.InvolvedObject.Name+" "+e.Reason+": "+e.Message)
	return e, nil
}

func (s *sink) Update(e *corev1.Event) (*corev1.Event, error) { return s.Create(e) }

// Patch keeps the message a patch writes: how a repeat, or an Event the
// aggregator combined with similar ones, reaches the API server.
func (s *sink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	patched := e.DeepCopy()
	if err := json.Unmarshal(data, patched); err != nil {
		return nil, err
	}
	return s.Create(patched)
}

func (s *sink) written() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// TestSpamFilter: the Events of one object keep a budget per reason, so
// that no reason, however often it is recorded, silences another; and a
// flapping reason is still held to client-go's burst.
func TestSpamFilter(t *testing.T) {
	for _, tc := range []struct {
		name string
		// flaps Events of reason HashPending, each with its own message,
		// come first; then one of reason, which is written or not.
		flaps   int
		reason  string
		written bool
	}{
		{name: "another reason after a flapping one is written", flaps: 30, reason: "UserRefused", written: true},
		{name: "the flapping reason within its burst is written", flaps: 24, reason: "HashPending", written: true},
		{name: "the flapping reason past its burst is not", flaps: 25, reason: "HashPending", written: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &sink{}
			b := record.NewBroadcaster(record.WithCorrelatorOptions(correlator(clocktesting.NewFakePassiveClock(time.Now()))))
			defer b.Shutdown()
			b.StartRecordingToSink(s)
			rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "guestbackup-controller"})
			bsls := &corev1.ObjectReference{Kind: "BackupStorageLocationServer", Namespace: "backup", Name: "main", UID: "u1", APIVersion: "guestbackup.io/v1alpha1"}
			for i := range tc.flaps {
				// A message of its own each time: not one Event counted up.
				rec.Eventf(bsls, corev1.EventTypeWarning, "HashPending", "flap %d", i)
			}
			rec.Eventf(bsls, corev1.EventTypeWarning, tc.reason, "the last one")
			// Written in order: once the marker (another object) is, the last one was or never will be.
			marker := &corev1.ObjectReference{Kind: "ConfigMap", Namespace: "backup", Name: "marker"}
			rec.Event(marker, corev1.EventTypeNormal, "Marker", "the end")
			if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
				return slices.Contains(s.written(), "marker Marker: the end"), nil
			}); err != nil {
				t.Fatalf("the marker Event was never written: %v", err)
			}
			last := fmt.Sprintf("main %s: ", tc.reason)
			got := slices.ContainsFunc(s.written(), func(e string) bool {
				return strings.HasPrefix(e, last) && strings.HasSuffix(e, "the last one")
			})
			if got != tc.written {
				t.Errorf("%q written: %v, want %v (written: %d Events)", last, got, tc.written, len(s.written()))
			}
		})
	}
}

// TestSpamKey: the key tells apart what client-go's does, and reasons.
func TestSpamKey(t *testing.T) {
	event := func(reason string) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "main.1"},
			Source:         corev1.EventSource{Component: "guestbackup-controller"},
			InvolvedObject: corev1.ObjectReference{Kind: "BackupStorageLocationServer", Namespace: "backup", Name: "main"},
			Type:           corev1.EventTypeWarning,
			Reason:         reason,
		}
	}
	if SpamKey(event("UserRefused")) == SpamKey(event("HashPending")) {
		t.Error("two reasons share a key")
	}
	other := event("UserRefused")
	other.InvolvedObject.Name = "other"
	if SpamKey(other) == SpamKey(event("UserRefused")) {
		t.Error("two objects share a key")
	}
	if a, b := event("UserRefused"), event("UserRefused"); SpamKey(a) != SpamKey(b) {
		t.Error("one reason of one object has two keys")
	}
}
