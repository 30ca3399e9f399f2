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
// without writing: listing and restoring keep working. After any
// compaction it makes the Kopia server re-read the index, and on a
// filesystem storage it holds a reserve of space for the compaction that a
// volume filled too early refused (Keeper). docs/operations.md ("A full
// storage") gives the costs.
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

	"github.com/guestbackup/guestbackup/pkg/storagespace"
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

// Contents is a set of manifest contents, by ID.
type Contents map[content.ID]struct{}

// Replaced reports whether a content of before is missing from after: some
// writer compacted them in between (only compaction deletes manifest
// contents), and a Kopia server that last read the index before it still
// counts the replaced ones.
func Replaced(before, after Contents) bool {
	for id := range before {
		if _, ok := after[id]; !ok {
			return true
		}
	}
	return false
}

// Result is what one pass found and did.
type Result struct {
	// Before and After are the manifest contents before and after the
	// pass; BytesBefore and BytesAfter their packed bytes.
	Before, After           Contents
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
// session of r. Compaction rewrites every live manifest entry unchanged (ID,
// labels, time, payload) into one content and marks the old contents
// deleted; Kopia's maintenance later drops them.
//
// Its cost: a pass that is not due reads the index only (a refresh: one
// listing of the index blobs, and a read of the new ones); a due one also
// reads every manifest content (BytesBefore) and writes one content of about
// BytesAfter in a pack blob, one index blob and a session marker.
func Pass(ctx context.Context, r repo.DirectRepository) (Result, error) {
	if err := r.Refresh(ctx); err != nil {
		return Result{}, fmt.Errorf("refresh the repository's index: %w", err)
	}
	var res Result
	var err error
	if res.Before, res.BytesBefore, err = list(ctx, r.ContentReader()); err != nil {
		return res, err
	}
	res.After, res.BytesAfter = res.Before, res.BytesBefore
	if !Due(len(res.Before)) {
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
	if err := r.Refresh(ctx); err != nil {
		return res, fmt.Errorf("refresh the repository's index: %w", err)
	}
	if res.After, res.BytesAfter, err = list(ctx, r.ContentReader()); err != nil {
		return res, err
	}
	return res, nil
}

// list is the manifest contents the index lists, and their packed bytes.
func list(ctx context.Context, cr content.Reader) (Contents, int64, error) {
	ids := Contents{}
	var bytes int64
	err := cr.IterateContents(ctx, content.IterateOptions{Range: index.PrefixRange(manifest.ContentPrefix)},
		func(ci content.Info) error {
			ids[ci.ContentID] = struct{}{}
			bytes += int64(ci.PackedLength)
			return nil
		})
	if err != nil {
		return nil, 0, fmt.Errorf("list manifest contents: %w", err)
	}
	return ids, bytes, nil
}

// Keeper runs Pass on a schedule, and makes the Kopia server beside it
// re-read the index whenever manifest contents it may still count were
// replaced, by this Keeper or any other writer (user sync's, maintenance's,
// another replica's): the server counts manifest contents in its own view of
// the index, and while the replaced ones are there it would still compact
// them on a guest's read.
//
// On a filesystem storage it also holds a reserve (ReserveName, of
// ReserveSize): when a due compaction fails, most likely because the
// volume is full, it gives the reserve back and compacts again at once, so
// that guests read without writing even when the volume filled up before a
// pass could compact.
type Keeper struct {
	// Repository is the server pod's own connection, opened for writing.
	Repository repo.Repository
	// Server is the Kopia server beside it.
	Server Server
	// Interval between passes; DefaultInterval when zero.
	Interval time.Duration
	// Log receives each compaction and each failure.
	Log logr.Logger

	// served is what the server was last known to have read; nil until
	// the first refresh, as another writer may have compacted since the
	// server opened the repository.
	served Contents
}

// Start runs k until ctx ends or stop is called; stop returns once it has.
func Start(ctx context.Context, k *Keeper) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.Run(ctx)
	}()
	return func() { cancel(); <-done }
}

// Run steps every Interval (with jitter, so that a BSLS's replicas spread
// theirs) until ctx ends, the first after one Interval: the Kopia server,
// starting beside it, reads a fresh index as it opens the repository. A
// failed step is logged and tried again at the next.
func (k *Keeper) Run(ctx context.Context) {
	interval := k.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(wait.Jitter(interval, 0.1)):
	}
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		if err := k.Step(ctx); err != nil && ctx.Err() == nil {
			k.Log.Error(err, "guests' reads may need a write", "threshold", KopiaThreshold)
		}
	}, interval, 0.1, true)
}

// Step is one pass, with the reserve's release when a due compaction
// fails, the server's refresh when manifest contents were replaced, and the
// reserve taken again as the volume allows.
func (k *Keeper) Step(ctx context.Context) error {
	dr, ok := k.Repository.(repo.DirectRepository)
	if !ok {
		return errors.New("manifest compaction needs a direct repository connection")
	}
	rsv := reserveOf(dr)
	res, err := Pass(ctx, dr)
	// Only a refusal for want of space is worth the reserve: any other
	// failure (a cancelled context, a manifest that does not parse) would
	// fail again in its space.
	if err != nil && rsv != nil && Due(len(res.Before)) && storagespace.Refused(err) {
		held, herr := rsv.held()
		if herr == nil && held > 0 {
			k.Log.Info("manifest compaction failed; compacting again in the reserve's space", "error", err.Error(), "reserve", held)
			if rerr := rsv.release(); rerr != nil {
				return errors.Join(err, rerr)
			}
			res, err = Pass(ctx, dr)
		}
	}
	if err != nil {
		k.holdReserve(rsv, res)
		return fmt.Errorf("manifest compaction (%d manifest contents): %w", len(res.Before), err)
	}
	if res.Compacted {
		k.Log.Info("manifest contents compacted", "before", len(res.Before), "after", len(res.After),
			"bytesBefore", res.BytesBefore, "bytesAfter", res.BytesAfter)
	}
	if k.Server != nil && (k.served == nil || res.Compacted || Replaced(k.served, res.After)) {
		if err := k.Server.Refresh(ctx); err != nil {
			return fmt.Errorf("the Kopia server did not re-read the index; until it does, it may compact manifest contents on a guest's read: %w", err)
		}
	}
	k.served = res.After
	k.holdReserve(rsv, res)
	return nil
}

// holdReserve takes the reserve (again) for the next compaction, which
// writes about what the manifests take now; a full volume holds it later,
// which is not an error of the Keeper's.
func (k *Keeper) holdReserve(rsv *reserve, res Result) {
	if rsv == nil {
		return
	}
	if err := rsv.hold(ReserveSize(max(res.BytesBefore, res.BytesAfter))); err != nil {
		k.Log.V(1).Info("reserve not held yet", "reason", err.Error())
	}
}
