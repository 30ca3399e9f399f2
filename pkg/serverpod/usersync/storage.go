package usersync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/format"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
	"github.com/guestbackup/guestbackup/pkg/storagespace"
)

// storageProbeTimeout bounds one check: a storage that does not answer
// within it is as unavailable as one that refuses.
const storageProbeTimeout = 10 * time.Second

// errNotDirect is the probe's answer for a repository it cannot check.
var errNotDirect = errors.New("the repository is not opened directly on its storage")

// watchStorage checks the repository's storage every interval until ctx
// ends, and publishes what it finds when it changes (checkStorage).
func (s *Syncer) watchStorage(ctx context.Context, interval time.Duration) {
	wait.UntilWithContext(ctx, s.checkStorage, interval)
}

// checkStorage asks the storage for the repository's format blob (one
// metadata request: on S3 a HEAD, on a filesystem a stat) and, where the
// storage is a filesystem, for its free space (a statfs), and publishes
// the outcome under maintenancestate.StorageKey, with the writes of the
// pod's the storage refused for want of space (noteWrite,
// maintenancePublisher), when it differs from the last one published
// (spaceMoved), or that is a StorageHeartbeat old: the
// controller makes it the StorageAvailable and StorageSpace conditions,
// whose changes are Events on the BSLS. A publication that fails is tried
// again at the next check.
func (s *Syncer) checkStorage(ctx context.Context) {
	probe, cancel := context.WithTimeout(ctx, storageProbeTimeout)
	err := probeStorage(probe, s.opts.Repository)
	space := measureSpace(probe, s.opts.Repository)
	cancel()
	if ctx.Err() != nil {
		return
	}
	refusedBefore, _ := s.space.refusal()
	previous := s.space.measure(space)
	refused, refusedAt := s.space.refusal()
	if refusedBefore != "" && space != nil && previous != nil && space.FreeBytes > previous.FreeBytes {
		// Space was freed since: a refused sync is tried again now, not
		// at the end of its backoff.
		s.poke()
	}
	state := maintenancestate.StorageState{Available: err == nil, Space: space, Refused: refused, RefusedAt: refusedAt}
	if err != nil {
		state.Error = err.Error()
	}
	state.UsersNotApplied = s.NotApplied()
	state.Quota = s.quotas.published()
	now := time.Now().UTC().Truncate(time.Second)
	last := s.storage
	if last != nil && last.Available == state.Available && last.Error == state.Error && last.Refused == state.Refused && last.UsersNotApplied == state.UsersNotApplied &&
		reflect.DeepEqual(last.Quota, state.Quota) && !spaceMoved(last.Space, state.Space) && now.Sub(last.CheckedAt) < maintenancestate.StorageHeartbeat {
		return
	}
	state.Since, state.CheckedAt = now, now
	if last != nil && last.Available == state.Available {
		state.Since = last.Since // the same state, or outage in other words
	}
	configMaps := s.opts.Client.CoreV1().ConfigMaps(s.opts.Namespace)
	if perr := maintenancestate.SetKey(ctx, configMaps, s.opts.BSLS, maintenancestate.StorageKey(s.opts.Pod),
		func(string) string { return maintenancestate.EncodeStorage(state) }); perr != nil {
		s.opts.Log.Error(perr, "storage state not published; tried again at the next check", "available", state.Available)
		return
	}
	s.storage = &state
	switch {
	case !state.Available:
		s.opts.Log.Error(err, "the repository's storage is unavailable")
	case last != nil && !last.Available:
		s.opts.Log.Info("the repository's storage is available again")
	}
}

// spaceStep is the share of its capacity by which a filesystem's free
// space must move before it is published again between heartbeats: the
// controller's view of it is that exact, and a volume that guests write
// to all day costs a ConfigMap update per step, not per check.
const spaceStep = 100 // 1%

// spaceMoved reports whether space now differs from what was published
// enough to publish it again: measured or not, a new capacity (a grown
// volume), full or not, or free space moved by a spaceStep.
func spaceMoved(published, now *maintenancestate.StorageSpace) bool {
	switch {
	case published == nil || now == nil:
		return (published == nil) != (now == nil)
	case published.CapacityBytes != now.CapacityBytes || (published.FreeBytes == 0) != (now.FreeBytes == 0):
		return true
	}
	moved := max(published.FreeBytes, now.FreeBytes) - min(published.FreeBytes, now.FreeBytes)
	return moved >= max(now.CapacityBytes/spaceStep, 1)
}

// measureSpace asks the repository's storage for its space: Kopia's
// filesystem storage answers with a statfs of its folder (one syscall,
// no listing). Storage that cannot tell (S3 and the like answer
// blob.ErrNotAVolume), and a statfs that fails (the probe reports an
// unavailable storage), are not measured: nil.
func measureSpace(ctx context.Context, r repo.Repository) *maintenancestate.StorageSpace {
	dr, ok := r.(repo.DirectRepository)
	if !ok {
		return nil
	}
	c, err := dr.BlobVolume().GetCapacity(ctx)
	if err != nil || c.SizeB == 0 {
		return nil
	}
	return &maintenancestate.StorageSpace{FreeBytes: c.FreeB, CapacityBytes: c.SizeB}
}

// Writers of the server pod whose writes to the repository the storage
// check watches for refusals (spaceState.note).
const (
	writerUserSync    = "user sync"
	writerMaintenance = "maintenance"
)

// noteWrite takes the outcome of a sync of the pod's user sync, which
// writes users to the repository: a refusal for want of space
// (storagespace.Refused) is published with the next storage check and
// stays until a later sync succeeds; other failures say nothing about
// space.
func (s *Syncer) noteWrite(err error) {
	failure := ""
	if err != nil {
		failure = err.Error()
	}
	s.space.note(writerUserSync, failure, storagespace.Refused(err), time.Now())
}

// spaceState is the storage's space as the last check measured it and
// the last write it refused of each of the pod's writers: the storage
// check, user sync's worker, maintenance's publisher and /metrics share
// it. It is a prometheus.Collector of what it holds.
type spaceState struct {
	mu       sync.Mutex
	measured *maintenancestate.StorageSpace
	refused  map[string]refusal
}

// refusal is a write the storage refused for want of space: its words,
// when, and the free space last measured then (nil: not measured).
type refusal struct {
	message string
	at      time.Time
	free    *uint64
}

// measure keeps space as the last measurement and returns the one before.
// A refusal on a volume that has since gained a spaceStep of free space
// ends: the volume speaks for itself, and a writer that tries again only
// at its next run (maintenance: up to an hour) must not keep the storage
// full in the admin's eyes after the claim grew. A writer refused again
// records it again.
func (sp *spaceState) measure(space *maintenancestate.StorageSpace) (previous *maintenancestate.StorageSpace) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	previous, sp.measured = sp.measured, space
	if space == nil {
		return previous
	}
	for writer, r := range sp.refused {
		if r.free != nil && space.FreeBytes >= *r.free+max(space.CapacityBytes/spaceStep, 1) {
			delete(sp.refused, writer)
		}
	}
	return previous
}

// note takes the outcome of writer's last attempt at the repository:
// failure "" is a success, which ends its refusal; refused says failure
// was for want of space. A refusal already recorded keeps its first words
// and time until it ends, so that each retry of the same write does not
// publish anew; a failure for another reason changes nothing.
func (sp *spaceState) note(writer, failure string, refused bool, at time.Time) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	switch _, known := sp.refused[writer]; {
	case failure == "":
		delete(sp.refused, writer)
	case refused && !known:
		if sp.refused == nil {
			sp.refused = map[string]refusal{}
		}
		r := refusal{message: failure, at: at.UTC().Truncate(time.Second)}
		if sp.measured != nil {
			free := sp.measured.FreeBytes
			r.free = &free
		}
		sp.refused[writer] = r
	}
}

// refusal is the writes refused, each with its writer, and since when
// the first was; "" when none is.
func (sp *spaceState) refusal() (string, time.Time) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var messages []string
	var since time.Time
	for _, writer := range slices.Sorted(maps.Keys(sp.refused)) {
		r := sp.refused[writer]
		messages = append(messages, writer+": "+r.message)
		if since.IsZero() || r.at.Before(since) {
			since = r.at
		}
	}
	return strings.Join(messages, "; "), since
}

// maintenancePublisher is maintenance's publisher, which notes each
// run's outcome in space: a maintenance run writes (index compaction,
// the schedule), and on S3 is often the only write of the pod's a
// quota refuses. Its failure is text by then (storagespace.RefusedText).
type maintenancePublisher struct {
	maintenance.ConfigMapPublisher
	space *spaceState
}

// Publish implements maintenance.Publisher.
func (p maintenancePublisher) Publish(ctx context.Context, s v1alpha1.MaintenanceStatus) error {
	p.space.note(writerMaintenance, s.Failure, storagespace.RefusedText(s.Failure), time.Now())
	return p.ConfigMapPublisher.Publish(ctx, s) //nolint:wrapcheck // the publisher's own words
}

var (
	storageFreeDesc = prometheus.NewDesc("guestbackup_server_storage_free_bytes",
		"Bytes the repository's filesystem storage (its PersistentVolume) had free for Kopia at the server pod's last storage check; absent where the storage cannot tell (S3).", nil, nil)
	storageCapacityDesc = prometheus.NewDesc("guestbackup_server_storage_capacity_bytes",
		"Size in bytes of the repository's filesystem storage at the server pod's last storage check; absent where the storage cannot tell (S3).", nil, nil)
	storageRefusedDesc = prometheus.NewDesc("guestbackup_server_storage_write_refused",
		"1 while the repository's storage refused the server pod's last write for want of space (a full volume, an S3 quota), until one succeeds; else 0.", nil, nil)
)

// Describe implements prometheus.Collector.
func (sp *spaceState) Describe(ch chan<- *prometheus.Desc) {
	ch <- storageFreeDesc
	ch <- storageCapacityDesc
	ch <- storageRefusedDesc
}

// Collect implements prometheus.Collector.
func (sp *spaceState) Collect(ch chan<- prometheus.Metric) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if m := sp.measured; m != nil {
		ch <- prometheus.MustNewConstMetric(storageFreeDesc, prometheus.GaugeValue, float64(m.FreeBytes))
		ch <- prometheus.MustNewConstMetric(storageCapacityDesc, prometheus.GaugeValue, float64(m.CapacityBytes))
	}
	refused := 0.0
	if len(sp.refused) > 0 {
		refused = 1
	}
	ch <- prometheus.MustNewConstMetric(storageRefusedDesc, prometheus.GaugeValue, refused)
}

// probeStorage reads the metadata of the repository's format blob from
// its storage.
func probeStorage(ctx context.Context, r repo.Repository) error {
	dr, ok := r.(repo.DirectRepository)
	if !ok {
		return errNotDirect
	}
	attempt, ctx := newLastAttempt(ctx)
	_, err := dr.BlobReader().GetMetadata(ctx, format.KopiaRepositoryBlobID)
	if err != nil && ctx.Err() != nil {
		// Kopia retries what it takes for passing trouble (a refused
		// connection included) until the context ends, and then says
		// only that: the storage's words are its last attempt's.
		if last := attempt.Error(); last != "" {
			return fmt.Errorf("no answer within %s (Kopia retried until then); the last attempt's error: %s", storageProbeTimeout, last)
		}
		return fmt.Errorf("no answer within %s (Kopia retried until then): %w", storageProbeTimeout, err)
	}
	return err //nolint:wrapcheck // the storage's own words are the message
}
