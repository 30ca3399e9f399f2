package kopiaserver

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

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
	// running is an instance whose virt-launcher started (Scheduled) at
	// the time given.
	running := func(scheduled time.Time) *kubevirtv1.VirtualMachineInstance {
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(scheduled.Add(-time.Minute))}}
		vmi.Status.Phase = kubevirtv1.Running
		vmi.Status.PhaseTransitionTimestamps = []kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{
			{Phase: kubevirtv1.Scheduled, PhaseTransitionTimestamp: metav1.NewTime(scheduled)},
		}
		return vmi
	}
	pending := &kubevirtv1.VirtualMachineInstance{}
	pending.Status.Phase = kubevirtv1.Scheduling
	succeeded := running(renderedAt.Add(-time.Hour))
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
		{"an instance whose launcher has not started", secret(bundle, renderedAt), pending, false},
		{"an instance that ended", secret(bundle, renderedAt), succeeded, false},
		{"a guest booted before its bootstrap carried the next CA", secret(bundle, renderedAt), running(renderedAt.Add(-time.Hour)), true},
		{"a guest booted in the second its bootstrap changed", secret(bundle, renderedAt), running(renderedAt.Truncate(time.Second)), false},
		{"a guest booted after", secret(bundle, renderedAt), running(renderedAt.Add(time.Minute)), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, why := guestWaits(tt.secret, tt.vmi, vmsecret.CASum(bundle))
			if got != tt.want || why == "" {
				t.Errorf("guestWaits = %v (%q), want %v", got, why, tt.want)
			}
		})
	}
}
