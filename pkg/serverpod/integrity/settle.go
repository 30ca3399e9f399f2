package integrity

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/kopia/kopia/snapshot/snapshotfs"
)

// A damaged snapshot cannot stay as it is for ever: Kopia's garbage
// collection walks every snapshot and fails on a content that is absent
// from the index, so while one references lost data, maintenance fails
// and the storage of expired snapshots is never freed. A damaged snapshot
// heals when its guest uploads the same data again, which it does at its
// next snapshot while one it builds on is damaged (the notice). Once the
// guest's latest snapshot is whole, what is still damaged can no longer
// heal that way: the files changed or went before the guest read them
// again. Those snapshots are settled: rewritten, as Kopia's `snapshot fix
// invalid-files --invalid-file-handling=stub` does, with each lost file
// replaced by a stub, `.INVALID.<name>`, whose content names the file and
// why. Every other file restores as before. A source whose guest never
// snapshots again (its VM is gone) is settled once it has been damaged
// for Options.SettleAfter.

// errLost is why a settled file was replaced.
var errLost = errors.New("guestbackup: the storage lost this file's data (see the BackupDamaged Event of the VM), and no later upload of the same data restored it")

// settle rewrites the damaged snapshots of the sources that can no longer
// heal, and of those overdue, and returns the sources it settled.
func settle(ctx context.Context, dr repo.DirectRepository, d *damage, pending map[content.ID]loss, stored map[blob.ID]int64, overdue func(snapshot.SourceInfo) bool) ([]*sourceDamage, error) {
	var settled []*sourceDamage
	for _, s := range d.sources {
		if !s.healing || overdue(s.src) {
			settled = append(settled, s)
		}
	}
	if len(settled) == 0 {
		return nil, nil
	}
	err := repo.DirectWriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup integrity: settle snapshots that cannot heal"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			check := newWalker(w, pending, stored)
			// The rewriter may call back from its workers while the
			// caller works too; the walker's maps are not shared safely.
			var mu sync.Mutex
			whole := func(ctx context.Context, oid object.ID) (bool, error) {
				mu.Lock()
				defer mu.Unlock()
				return check.whole(ctx, oid)
			}
			rw, err := snapshotfs.NewDirRewriter(ctx, w, snapshotfs.DirRewriterOptions{
				Parallel: 1,
				RewriteEntry: func(ctx context.Context, parentPath string, e *snapshot.DirEntry) (*snapshot.DirEntry, error) {
					if e.Type == snapshot.EntryTypeDirectory {
						return e, nil // the rewriter reads it, or stubs it when it cannot
					}
					ok, err := whole(ctx, e.ObjectID)
					if err != nil || ok {
						return e, err
					}
					return snapshotfs.RewriteAsStub(w)(ctx, parentPath, e, errLost)
				},
				OnDirectoryReadFailure: func(ctx context.Context, parentPath string, e *snapshot.DirEntry, err error) (*snapshot.DirEntry, error) {
					// Only a directory whose own data is lost becomes a
					// stub: a read that failed for a passing reason
					// fails the settling, and nothing is rewritten.
					ok, werr := whole(ctx, e.ObjectID)
					if werr != nil || ok {
						return nil, fmt.Errorf("directory %s could not be read, though its data is not lost: %w", parentPath, errors.Join(err, werr))
					}
					return snapshotfs.RewriteAsStub(w)(ctx, parentPath, e, errLost)
				},
			})
			if err != nil {
				return fmt.Errorf("rewrite damaged snapshots: %w", err)
			}
			defer rw.Close(ctx)
			for _, s := range settled {
				tree, err := policy.TreeForSource(ctx, w, s.src)
				if err != nil {
					return fmt.Errorf("policy of %s: %w", s.src, err)
				}
				compressor := tree.EffectivePolicy().MetadataCompressionPolicy.MetadataCompressor()
				for _, m := range s.damaged {
					changed, err := rw.RewriteSnapshotManifest(ctx, m, compressor)
					if err != nil {
						return fmt.Errorf("rewrite snapshot %s of %s: %w", m.ID, s.src, err)
					}
					if !changed {
						continue
					}
					if err := snapshot.UpdateSnapshot(ctx, w, m); err != nil {
						return fmt.Errorf("replace snapshot of %s: %w", s.src, err)
					}
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	if err := dr.Refresh(ctx); err != nil {
		return nil, fmt.Errorf("refresh after settling snapshots: %w", err)
	}
	return settled, nil
}
