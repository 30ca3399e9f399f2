package kopiaserver

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// desired is what desire makes of one pass's observations: decide's
// decision, and everything the pass then writes.
type desired struct {
	decision
	// Objects are the server's objects, applied in this order with the
	// BSLS as their controlling owner: its identity, Service and
	// NetworkPolicy always; its Deployment only while storage and
	// certificate have no problem (an existing one keeps running, as it
	// is, while either is broken).
	Objects []client.Object
	// Status is the BSLS's whole status after the pass.
	Status v1alpha1.BackupStorageLocationServerStatus
	// Events are recorded on the BSLS once Status is written.
	Events []bslsEvent
}

// bslsEvent is an Event to record on the BSLS.
type bslsEvent struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type    string
	Reason  string
	Message string
}

// desire is the BSLS reconciler's whole policy: from what a pass found,
// the objects to apply, the status to write, the Events that announce
// what changed against the status the previous pass wrote, and when to
// look again. It reads nothing but obs.
func desire(obs observations) (desired, error) {
	b := obs.BSLS
	sa, role, binding := ServerRole(b)
	want := desired{Objects: []client.Object{sa, role, binding, Service(b), NetworkPolicy(b, obs.ControllerNamespace)}}
	seen := obs
	if obs.RepositoryProblem == nil && obs.CertificateProblem == nil {
		in := obs.Workload
		in.TLSChecksum = obs.Certificate.material.Checksum
		d, err := Deployment(b, in)
		if err != nil {
			return desired{}, err
		}
		want.Objects = append(want.Objects, d)
		// The server is judged as the apply leaves its Deployment: this
		// spec (spec.replicas 0 is ScaledToZero at once), the status the
		// cluster last reported.
		applied := d.DeepCopy()
		if obs.Deployment != nil {
			applied.Status = obs.Deployment.Status
		}
		seen.Deployment = applied
	}
	want.decision = decide(seen)
	want.Status, want.Events = status(obs, want.decision)
	return want, nil
}

// status is the BSLS's status after a pass that found obs and decided d,
// and the Events that announce what changed in it.
func status(obs observations, d decision) (v1alpha1.BackupStorageLocationServerStatus, []bslsEvent) {
	b := obs.BSLS
	before := b.Status
	st := *before.DeepCopy()
	var events []bslsEvent
	if obs.CertificateProblem == nil {
		st.TLSCA = string(obs.Certificate.material.CA)
		st.TLSFingerprint = obs.Certificate.material.Pin
		st.CARotation = obs.Certificate.rotation
		if msg, changed := caChange(before.TLSFingerprint, st.TLSFingerprint, obs.Certificate.source); changed {
			typ := corev1.EventTypeWarning
			if rot := before.CARotation; rot != nil && rot.NextFingerprint == st.TLSFingerprint {
				// The switch a rotation planned: no running guest is left
				// without the new CA.
				typ, msg = corev1.EventTypeNormal, rotatedCAChange(before.TLSFingerprint, st.TLSFingerprint, rot.StartTime)
			}
			events = append(events, bslsEvent{typ, ReasonCAChanged, msg})
		}
	}
	st.Endpoint = Endpoint(b)
	if d.RepositoryOpened && st.RepositoryOpened == nil {
		// From now on a lost password is reported, never replaced.
		st.RepositoryOpened = &metav1.Time{Time: obs.Now}
	}
	st.Maintenance = obs.Maintenance
	st.Integrity = d.Integrity
	st.Quota = d.Quota
	st.Client = obs.Client
	st.RequestPollInterval = nil
	if obs.Requests && obs.Client != nil {
		// The guests poll the client port, which the server pod serves
		// with its client.
		st.RequestPollInterval = &metav1.Duration{Duration: RequestPollInterval(b)}
	}
	st.Users = int32(obs.Users.Count) //nolint:gosec // bounded far below 2^31 by Secret sizes
	namespaces := ServedNamespaces(obs.Users)
	st.Namespaces = int32(len(namespaces)) //nolint:gosec // bounded by the users
	if len(namespaces) > 1 && before.Namespaces <= 1 {
		events = append(events, bslsEvent{corev1.EventTypeWarning, ReasonSharedAcrossNamespaces, sharedMessage(namespaces)})
	}
	for _, c := range d.Conditions {
		if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = metav1.NewTime(obs.Now)
		}
		meta.SetStatusCondition(&st.Conditions, c)
	}
	st.ObservedGeneration = b.Generation
	return st, append(events, transitions(before.Conditions, st.Conditions)...)
}

// transitions are the Events of every condition whose status or reason
// changed from before to after: Normal when it became True or Unknown,
// else Warning.
func transitions(before, after []metav1.Condition) []bslsEvent {
	var events []bslsEvent
	for _, c := range after {
		old := meta.FindStatusCondition(before, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		kind := corev1.EventTypeWarning
		if c.Status == metav1.ConditionTrue || c.Status == metav1.ConditionUnknown {
			kind = corev1.EventTypeNormal
		}
		events = append(events, bslsEvent{kind, c.Reason, c.Type + ": " + c.Message})
	}
	return events
}
