package integrity

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// Metrics of the user-sync container's /metrics. See docs/events.md.
var (
	lastPass = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "guestbackup_server_integrity_last_pass_timestamp_seconds",
		Help: "When the last verification pass of the repository ended (Unix time), whatever its outcome.",
	})
	lastVerified = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "guestbackup_server_integrity_last_verified_timestamp_seconds",
		Help: "When the last complete verification pass of the repository ended (Unix time).",
	})
	damagedSnapshots = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "guestbackup_server_integrity_damaged_snapshots",
		Help: "Snapshots that reference data the storage lost, as of the last complete pass (see the RepositoryIntact condition).",
	})
	lostContents = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "guestbackup_server_integrity_lost_contents_total",
		Help: "Contents verification found missing from the storage or not reading back, and dropped from the index so that they are uploaded again.",
	})
	readBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "guestbackup_server_integrity_read_bytes_total",
		Help: "Pack bytes verification read back from the storage and decrypted.",
	})
	passFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "guestbackup_server_integrity_pass_failures_total",
		Help: "Verification passes that could not complete (the storage did not answer, say).",
	})
	passDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "guestbackup_server_integrity_pass_duration_seconds",
		Help:    "How long a complete verification pass took.",
		Buckets: prometheus.ExponentialBuckets(0.1, 4, 8),
	})
)

// Collectors are the metrics above, for a registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{lastPass, lastVerified, damagedSnapshots, lostContents, readBytes, passFailures, passDuration}
}

// setGauges sets the gauges from a pass's state.
func setGauges(s maintenancestate.IntegrityState) {
	lastPass.Set(float64(s.CheckedAt.Unix()))
	if !s.VerifiedAt.IsZero() {
		lastVerified.Set(float64(s.VerifiedAt.Unix()))
	}
	damagedSnapshots.Set(float64(s.DamagedSnapshots))
}

// event is one Event to record on the BSLS.
type event struct {
	warning         bool
	reason, message string
}

// events are what the admin is told of a pass that ended in now, after
// last, while failing is the last failure already told.
func events(last, now maintenancestate.IntegrityState, failing string) []event {
	if now.Error != "" {
		if now.Error == failing {
			return nil
		}
		msg := "Repository verification could not complete, and is tried again at the next pass: " + now.Error
		if !now.VerifiedAt.IsZero() {
			msg += "; the last complete pass, at " + now.VerifiedAt.Format(time.RFC3339) + ", stands"
		}
		return []event{{warning: true, reason: ReasonVerificationFailing, message: msg}}
	}
	var out []event
	if len(now.Settled) > 0 {
		out = append(out, event{warning: true, reason: ReasonSnapshotsSettled, message: settledMessage(now.Settled)})
	}
	switch {
	case now.LostContents > 0:
		out = append(out, event{warning: true, reason: ReasonRepositoryDamaged, message: damagedMessage(now)})
	case now.DamagedSnapshots == 0 && (last.DamagedSnapshots > 0 || last.LostContents > 0):
		msg := "No snapshot references lost data any more"
		if len(now.Settled) == 0 {
			msg += ": the guests uploaded it again"
		}
		if !last.DamagedSince.IsZero() {
			msg += " (damaged since " + last.DamagedSince.Format(time.RFC3339) + ")"
		}
		out = append(out, event{reason: ReasonRepositoryIntactAgain, message: msg})
	}
	return out
}

// settledMessage says which snapshots were settled, and what that means.
func settledMessage(settled []maintenancestate.DamagedSource) string {
	snapshots, files := 0, 0
	guests := map[string]bool{}
	for _, s := range settled {
		snapshots += s.Snapshots
		files += s.Files
		guests[s.User+"@"+s.Host] = true
	}
	return fmt.Sprintf("%d damaged snapshots of %d guests could no longer heal (their guest's latest snapshot is whole, or the damage is a week old) and were rewritten: each of the %d lost files is replaced by a stub, .INVALID.<name>, naming what was lost; every other file restores as before, and maintenance can collect again. The snapshots' IDs changed.",
		snapshots, len(guests), files)
}

// damagedMessage says what a pass found lost and what happens next.
func damagedMessage(s maintenancestate.IntegrityState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Verification found %d contents lost", s.LostContents)
	if len(s.MissingPacks) > 0 {
		fmt.Fprintf(&b, "; packs missing from the storage: %s", strings.Join(s.MissingPacks, ", "))
	}
	if len(s.DamagedPacks) > 0 {
		fmt.Fprintf(&b, "; packs whose contents do not read back: %s", strings.Join(s.DamagedPacks, ", "))
	}
	b.WriteString(". They are dropped from the index, so that the next snapshot of the same data uploads them again")
	if s.Pending > 0 {
		fmt.Fprintf(&b, "; %d of them wait for that: contents Kopia's garbage collection deleted recently keep them in the index, where a guest's client takes them for present, until Kopia's maintenance lets go of those (within its safety margins)", s.Pending)
	}
	if s.DamagedSnapshots > 0 {
		guests := map[string]bool{}
		for _, d := range s.Damaged {
			guests[d.User+"@"+d.Host] = true
		}
		fmt.Fprintf(&b, "; %d snapshots of %d guests reference lost data (status.integrity lists them, and each VM gets a BackupDamaged Event)", s.DamagedSnapshots, len(guests))
	}
	b.WriteString(". See docs/operations.md, \"Verification\".")
	return b.String()
}
