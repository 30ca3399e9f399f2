package vmevent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
)

// onVM is how the fake recorder shows an Event's object: the VM, by its
// kind and version.
const onVM = " involvedObject{kind=VirtualMachine,apiVersion=kubevirt.io/v1}"

func TestRecord(t *testing.T) {
	tests := []struct {
		name   string
		events []Event
		want   []string
	}{
		{name: "nothing to say", want: nil},
		{
			name: "in order, with type and reason",
			events: []Event{
				{corev1.EventTypeNormal, "CredentialsIssued", "issued"},
				{corev1.EventTypeWarning, "BackupStale", "no snapshot"},
			},
			want: []string{
				"Normal CredentialsIssued issued" + onVM,
				"Warning BackupStale no snapshot" + onVM,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := record.NewFakeRecorder(len(tt.events) + 1)
			rec.IncludeObject = true
			Record(rec, metav1.ObjectMeta{Name: "web", Namespace: "team-a"}, tt.events)
			close(rec.Events)
			var got []string
			for e := range rec.Events {
				got = append(got, e)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("recorded %q, want %q", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d = %q, want %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// A handler or reconciler built without a recorder (as in unit tests)
// records nothing rather than panicking.
func TestRecordWithoutRecorder(t *testing.T) {
	Record(nil, metav1.ObjectMeta{Name: "web"}, []Event{{corev1.EventTypeNormal, "X", "y"}})
}
