// Package readkeeper keeps guests' reads working when the storage is full.
//
// Kopia stores manifests (snapshots, policies, users, ACLs) in contents
// whose IDs start with "m", one more each time a writer flushes new
// manifests. Whoever next loads them with 16 or more such contents compacts
// them into one before answering (Kopia's committedManifestManager,
// maybeCompactLocked, a threshold repo.Open does not let us change): the
// Kopia server does so in the write session of every guest's session,
// listing included. That compaction writes a session marker blob, a pack and
// an index blob; on a full storage it fails, and the read fails with it
// ("unable to find snapshot manifests: error auto-compacting contents: ...
// no space left on device"), for every guest, until space comes back.
//
// The Keeper compacts earlier, from the server pod's own connection and with
// Kopia's own compaction code (a manifest.Manager over a write session's
// content manager, with a lower threshold), while the storage still takes
// writes. When the storage then fills up, fewer than Kopia's 16 manifest
// contents are left, nothing can add more, and the Kopia server loads them
// without writing: listing and restoring keep working.
package readkeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/content/index"
	"github.com/kopia/kopia/repo/manifest"
	"k8s.io/apimachinery/pkg/util/wait"
)

// KopiaThreshold is the number of manifest contents at which Kopia
// compacts them on load, writing (autoCompactionContentCountDefault in
// kopia v0.23.1's repo/manifest). A read needs no write while fewer remain.
const KopiaThreshold = 16

// Threshold is the number of manifest contents at which the Keeper
// compacts them. Half of Kopia's: after a pass fewer than Threshold remain,
// so the storage may fill up after KopiaThreshold-Threshold further
// manifest flushes and reads still need no write; and since each compaction
// waits for Threshold-1 new contents, the Keeper compacts at most about
// twice as often as Kopia itself would.
const Threshold = KopiaThreshold / 2

// DefaultInterval is how often a Keeper looks at the manifest contents.
// A pass that finds fewer than Threshold reads only the index (one
// refresh); see Pass.
const DefaultInterval = time.Minute

// Due reports whether a repository holding count manifest contents should
// be compacted now.
func Due(count int) bool { return count >= Threshold }

// Result is what one pass found and did.
type Result struct {
	// Before and After are the numbers of manifest contents before and
	// after the pass; Bytes the packed bytes they took before and after.
	Before, After           int
	BytesBefore, BytesAfter int64
	// Compacted is set when the pass compacted.
	Compacted bool
}

// Server is the Kopia server that serves the guests (serverpod.ControlClient).
type Server interface {
	// Refresh makes it re-read the repository's index.
	Refresh(ctx context.Context) error
}

// Pass refreshes r's view of the repository and, when Due, compacts its
// manifest contents into one with Kopia's own compaction, in a write
// session of r, then makes server (when not nil) refresh: the server counts
// manifest contents in its own view of the index, where the ones the
// compaction replaced stay until it refreshes, and would still compact them
// on a guest's read. Compaction rewrites every live manifest entry unchanged (ID,
// labels, time, payload) and marks the old contents deleted; Kopia's
// maintenance later drops them.
//
// Its cost: a pass that is not due reads the index only; a due one reads
// every manifest content (BytesBefore) and writes one content of about
// BytesAfter in a pack blob, one index blob and a session marker.
func Pass(ctx context.Context, r repo.DirectRepository, server Server) (Result, error) {
	if err := r.Refresh(ctx); err != nil {
		return Result{}, fmt.Errorf("refresh the repository's index: %w", err)
	}
	var res Result
	var err error
	if res.Before, res.BytesBefore, err = count(ctx, r.ContentReader()); err != nil {
		return res, err
	}
	res.After, res.BytesAfter = res.Before, res.BytesBefore
	if !Due(res.Before) {
		return res, nil
	}
	err = repo.DirectWriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup manifest compaction"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			mm, err := manifest.NewManager(ctx, w.ContentManager(), manifest.ManagerOptions{AutoCompactionThreshold: Threshold}, nil)
			if err != nil {
				return fmt.Errorf("manifest manager: %w", err)
			}
			// Loading is what compacts (and flushes) at the threshold given;
			// Manager.Compact alone would compact nothing, as it loads nothing.
			// No manifest carries this label: the answer is empty.
			if _, err := mm.Find(ctx, map[string]string{manifest.TypeLabelKey: "guestbackup-readkeeper-none"}); err != nil {
				return fmt.Errorf("compact manifest contents: %w", err)
			}
			return nil
		})
	if err != nil {
		return res, err
	}
	res.Compacted = true
	if server != nil {
		if err := server.Refresh(ctx); err != nil {
			return res, fmt.Errorf("refresh the Kopia server after compacting manifest contents: %w", err)
		}
	}
	if err := r.Refresh(ctx); err != nil {
		return res, fmt.Errorf("refresh the repository's index: %w", err)
	}
	if res.After, res.BytesAfter, err = count(ctx, r.ContentReader()); err != nil {
		return res, err
	}
	return res, nil
}

// count is the number of manifest contents the index lists, and their
// packed bytes.
func count(ctx context.Context, cr content.Reader) (n int, bytes int64, err error) {
	err = cr.IterateContents(ctx, content.IterateOptions{Range: index.PrefixRange(manifest.ContentPrefix)},
		func(ci content.Info) error {
			n++
			bytes += int64(ci.PackedLength)
			return nil
		})
	if err != nil {
		return 0, 0, fmt.Errorf("list manifest contents: %w", err)
	}
	return n, bytes, nil
}

// Keeper runs Pass on a schedule.
type Keeper struct {
	// Repository is the server pod's own connection, opened for writing.
	Repository repo.Repository
	// Server is the Kopia server beside it, refreshed after a compaction.
	Server Server
	// Interval between passes; DefaultInterval when zero.
	Interval time.Duration
	// Log receives each compaction and each failure.
	Log logr.Logger
}

// Run passes every Interval (with jitter, so that a BSLS's replicas spread
// theirs) until ctx ends. A failed pass is logged and retried at the next:
// on a full storage a due compaction fails as the guests' own would, and
// succeeds once space is back.
func (k Keeper) Run(ctx context.Context) {
	dr, ok := k.Repository.(repo.DirectRepository)
	if !ok {
		k.Log.Error(errors.New("not a direct repository"), "manifest compaction disabled")
		return
	}
	interval := k.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		res, err := Pass(ctx, dr, k.Server)
		switch {
		case err != nil && ctx.Err() == nil:
			k.Log.Error(err, "manifest compaction failed; guests' reads need a write once 16 manifest contents accumulate", "contents", res.Before)
		case res.Compacted:
			k.Log.Info("manifest contents compacted", "before", res.Before, "after", res.After, "bytesBefore", res.BytesBefore, "bytesAfter", res.BytesAfter)
		}
	}, interval, 0.1, true)
}
