package usersync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/format"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
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
// metadata request: on S3 a HEAD, on a filesystem a stat) and publishes
// the outcome under maintenancestate.StorageKey when it differs from the
// last one published, or that is a StorageHeartbeat old: the controller
// makes it the StorageAvailable condition, whose changes are Events on the
// BSLS. A publication that fails is tried again at the next check.
func (s *Syncer) checkStorage(ctx context.Context) {
	probe, cancel := context.WithTimeout(ctx, storageProbeTimeout)
	err := probeStorage(probe, s.opts.Repository)
	cancel()
	if ctx.Err() != nil {
		return
	}
	state := maintenancestate.StorageState{Available: err == nil}
	if err != nil {
		state.Error = err.Error()
	}
	now := time.Now().UTC().Truncate(time.Second)
	last := s.storage
	if last != nil && last.Available == state.Available && last.Error == state.Error && now.Sub(last.CheckedAt) < maintenancestate.StorageHeartbeat {
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

// probeStorage reads the metadata of the repository's format blob from
// its storage.
func probeStorage(ctx context.Context, r repo.Repository) error {
	dr, ok := r.(repo.DirectRepository)
	if !ok {
		return errNotDirect
	}
	_, err := dr.BlobReader().GetMetadata(ctx, format.KopiaRepositoryBlobID)
	if err != nil && ctx.Err() != nil {
		// Kopia retries what it takes for passing trouble (a refused
		// connection included) until the context ends, and then says
		// only that.
		return fmt.Errorf("no answer within %s (Kopia retried until then): %w", storageProbeTimeout, err)
	}
	return err //nolint:wrapcheck // the storage's own words are the message
}
