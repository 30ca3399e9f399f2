package audit

import (
	"fmt"
	"time"

	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/vmevent"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// Warning reasons of a guest's report about its kopia client (package
// clientdist): it cannot back up until what they say is fixed.
const (
	// ReasonClientChecksumMismatch: the guest downloaded a kopia client
	// whose SHA-256 is not the one its bootstrap carries, and refused it.
	ReasonClientChecksumMismatch = "ClientChecksumMismatch"
	// ReasonClientDownloadFailed: the guest has no kopia of the server's
	// build and could not download it.
	ReasonClientDownloadFailed = "ClientDownloadFailed"
	// ReasonSnapshotHookFailed: an owner's pre-snapshot hook failed in
	// the guest, so its scheduled snapshot was not taken.
	ReasonSnapshotHookFailed = "SnapshotHookFailed"
)

// AnnotationClientReport (audit) on the credential Secret is the report
// last announced (its kind and time), so that none is announced twice.
const AnnotationClientReport = vmsecret.AnnotationClientReport

// decideReport adds to d the Event of a guest's report not announced yet.
func decideReport(d *Decision, announced map[string]string, r *activity.Report) {
	if r == nil {
		return
	}
	id := r.Kind + "@" + r.At.UTC().Format(time.RFC3339)
	if announced[AnnotationClientReport] == id {
		return
	}
	at := r.At.UTC().Format(time.RFC3339)
	switch r.Kind {
	case clientdist.ReportHookFailed:
		d.Events = append(d.Events, vmevent.Warning(ReasonSnapshotHookFailed, fmt.Sprintf(
			"The guest's scheduled snapshot at %s was not taken: %s. Fix the hook in the guest (/etc/guestbackup/hooks/pre-snapshot.d); journalctl -u guestbackup-snapshot shows its output",
			at, r.Message)))
	default:
		reason, what := ReasonClientDownloadFailed, "has no kopia client and cannot download one"
		if r.Kind == clientdist.ReportChecksumMismatch {
			reason, what = ReasonClientChecksumMismatch, "refused the kopia client it downloaded: its SHA-256 is not the one its bootstrap carries (tampered with, or the server changed since the VM started)"
		}
		d.Events = append(d.Events, vmevent.Warning(reason, fmt.Sprintf(
			"Guest %s at %s, so it cannot back up; it says: %q. Look in the guest at /var/lib/guestbackup/status; restart the VM after the server is fixed",
			what, at, r.Message)))
	}
	d.Annotations[AnnotationClientReport] = id
}
