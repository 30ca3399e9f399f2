package kopiaserver

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

func TestDecideRotation(t *testing.T) {
	started := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	overlap := 2 * time.Minute
	for _, tt := range []struct {
		name    string
		reason  string
		hasNext bool
		waiting int
		now     time.Time
		want    rotationStep
	}{
		{"nothing asked", "", false, 0, started, rotationNone},
		{"asked: the next CA is issued", "yearly", false, 0, started, rotationStart},
		{"guests wait for a restart", "yearly", true, 3, started.Add(time.Hour), rotationWait},
		{"no guest waits, but the overlap is not over", "yearly", true, 0, started.Add(overlap - time.Second), rotationWait},
		{"no guest waits once the overlap is over: the switch", "yearly", true, 0, started.Add(overlap), rotationSwitch},
		{"the annotation went before the switch: called off", "", true, 2, started.Add(time.Hour), rotationCancel},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := decideRotation(tt.reason, tt.hasNext, tt.waiting, started, tt.now, overlap); got != tt.want {
				t.Errorf("decideRotation = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestGuestWaits(t *testing.T) {
	bundle := []byte("current and next")
	renderedAt := time.Date(2026, 12, 7, 10, 0, 0, 700_000_000, time.UTC)
	secret := func(ca []byte, at time.Time) *corev1.Secret {
		s := &corev1.Secret{}
		vmsecret.SetRendered(s, "https://main.backup.svc:51515", ca, at)
		return s
	}
	// created is a running instance the API server created at the time
	// given.
	created := func(at time.Time) *kubevirtv1.VirtualMachineInstance {
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(at)}}
		vmi.Status.Phase = kubevirtv1.Running
		return vmi
	}
	pending := created(renderedAt.Add(-time.Hour))
	pending.Status.Phase = kubevirtv1.Scheduling
	succeeded := created(renderedAt.Add(-time.Hour))
	succeeded.Status.Phase = kubevirtv1.Succeeded
	withoutRecord := secret(bundle, renderedAt)
	delete(withoutRecord.Annotations, vmsecret.AnnotationRenderedCAAt)

	for _, tt := range []struct {
		name   string
		secret *corev1.Secret
		vmi    *kubevirtv1.VirtualMachineInstance
		want   bool
	}{
		{"a bootstrap without the next CA", secret([]byte("current"), renderedAt), nil, true},
		{"a bootstrap that does not say since when it carries it", withoutRecord, nil, true},
		{"no instance: its next start reads the bootstrap", secret(bundle, renderedAt), nil, false},
		{"an instance that ended", secret(bundle, renderedAt), succeeded, false},
		{"a guest started before its bootstrap carried the next CA", secret(bundle, renderedAt), created(renderedAt.Add(-time.Hour)), true},
		{"an instance created before, whose launcher has not started: it may read either", secret(bundle, renderedAt), pending, true},
		{"an instance created within the margin of the render", secret(bundle, renderedAt), created(renderedAt.Add(guestTrustMargin - time.Second)), true},
		{"an instance created after, past the margin", secret(bundle, renderedAt), created(renderedAt.Add(guestTrustMargin)), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, why := guestWaits(tt.secret, tt.vmi, vmsecret.CASum(bundle))
			if got != tt.want || why == "" {
				t.Errorf("guestWaits = %v (%q), want %v", got, why, tt.want)
			}
		})
	}
}

func TestClientWaits(t *testing.T) {
	bundle := []byte("current and next")
	started := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	overlap := 24 * time.Hour
	carrying := func(ca []byte) *corev1.Secret {
		return &corev1.Secret{Data: map[string][]byte{clientsecret.KeyCA: ca}}
	}
	for _, tt := range []struct {
		name   string
		secret *corev1.Secret
		now    time.Time
		want   bool
	}{
		{"no Secret yet", nil, started.Add(48 * time.Hour), true},
		{"a Secret with the current CA alone", carrying([]byte("current")), started.Add(48 * time.Hour), true},
		{"both CAs, within the clients' overlap", carrying(bundle), started.Add(overlap - time.Second), true},
		{"both CAs, the overlap over", carrying(bundle), started.Add(overlap), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got, why := clientWaits(tt.secret, bundle, started, tt.now, overlap); got != tt.want || why == "" {
				t.Errorf("clientWaits = %v (%q), want %v", got, why, tt.want)
			}
		})
	}
}
