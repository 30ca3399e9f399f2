package integrity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/content/indexblob"
	kopiamaintenance "github.com/kopia/kopia/repo/maintenance"
	"github.com/kopia/kopia/repo/manifest"
	"k8s.io/utils/clock"
)

// Marking a lost content deleted is not enough for a guest to upload it
// again. A Kopia client connected to a server asks the server whether a
// content of 50 kB or more exists before it sends it
// (grpcRepositoryClient.doWriteAsync in Kopia v0.23.1), and the server
// answers with the index entry, deleted or not: the client takes a
// deleted content for present and skips it. Only a content absent from
// the index is uploaded. The index drops a deleted entry once its deletion
// time is at or before the repository's deletion watermark, so forget
// moves the watermark past the dropped contents.
//
// The watermark is one time for every deleted entry: moving it also drops
// what Kopia's garbage collection deleted, which Kopia keeps for a while
// so that a snapshot that references one after all (a client connected
// to a server takes a deleted content for present and references it)
// has it undeleted by the next collection. Before forget runs, the pass
// has undeleted every such content a snapshot references (undelete), as
// that collection would, since Kopia's own cannot run while a snapshot
// references lost data. What remains in the way is what the collection
// deleted within Kopia's margins for a snapshot still running
// (gcMargin), whose pack the storage still holds: then the lost contents
// wait, counted as pending, and forget tries again at the next pass.
//
// Manifest contents are never in the way: Kopia's manifest manager
// deletes them when it compacts them (once there are 16; every snapshot
// adds one) after writing their entries into a new content, its garbage
// collection leaves them alone, and a reader that lost a race with a
// compaction loads the manifests again. Counting them would keep the
// watermark still in any repository with a few snapshots (found by the
// end-to-end spec). Neither is an entry deleted after the newest dropped
// content, which the watermark does not reach.
//
// A lost content whose pack came back whole (an admin restored it from the
// bucket's versions) is undeleted instead.

// gcMargin is Kopia's margin, under its full safety, between a garbage
// collection and the drop of what it deleted: a snapshot running across a
// collection that takes longer is not protected by Kopia either.
var gcMargin = kopiamaintenance.SafetyFull.MarginBetweenSnapshotGC + kopiamaintenance.SafetyFull.DropContentFromIndexExtraMargin

// forget makes the pending dropped contents absent from the index, and
// returns those it could not yet.
//
// It never moves the watermark ahead of the clock. Kopia stamps a deletion
// at least a second after the index entry it replaces, so a content written
// or undeleted shortly before its drop carries a deletion stamp ahead of
// the clock. A guest's upload of that content again before the clock gets
// there is stamped before the deletion, loses to it in the index, and
// vanishes with it below the watermark: the snapshot that references it is
// damaged from the start (two specs that snapshot right after a pass failed
// so, 3 times in 3 runs of the package on a fast machine). forget waits on
// clk until the clock has reached the newest stamp, so that every later
// upload is stamped at or after it, and wins.
func forget(ctx context.Context, dr repo.DirectRepository, stored map[blob.ID]int64, pending map[content.ID]loss, clk clock.Clock) (map[content.ID]loss, error) {
	now := clk.Now()
	if len(pending) == 0 {
		return pending, nil
	}
	back := map[content.ID]bool{}
	for id, l := range pending {
		if l.why != whyDamaged && stored[l.pack] >= l.end {
			back[id] = true
		}
	}
	if err := undelete(ctx, dr, back); err != nil {
		return pending, err
	}
	remaining := map[content.ID]loss{}
	for id, l := range pending {
		if !back[id] {
			remaining[id] = l
		}
	}
	if len(remaining) == 0 {
		return nil, nil
	}
	em, ok, err := dr.ContentReader().EpochManager(ctx)
	if err != nil {
		return remaining, fmt.Errorf("read the index's epochs: %w", err)
	}
	if !ok {
		if err := forgetLegacy(ctx, dr, remaining); err != nil {
			return remaining, err
		}
		return nil, nil
	}
	cs, err := em.Current(ctx)
	if err != nil {
		return remaining, fmt.Errorf("read the deletion watermark: %w", err)
	}
	var latest time.Time
	// others are the deletion times of the entries that may be in the
	// way; whether they are is known once latest is.
	var others []time.Time
	still := map[content.ID]loss{}
	err = dr.ContentReader().IterateContents(ctx, content.IterateOptions{IncludeDeleted: true}, func(ci content.Info) error {
		if !ci.Deleted || !ci.Timestamp().After(cs.DeletionWatermark) {
			return nil
		}
		if l, ours := remaining[ci.ContentID]; ours {
			still[ci.ContentID] = l
			if ci.Timestamp().After(latest) {
				latest = ci.Timestamp()
			}
			return nil
		}
		if ci.ContentID.Prefix() == manifest.ContentPrefix || now.Sub(ci.Timestamp()) >= gcMargin {
			return nil
		}
		if _, held := stored[ci.PackBlobID]; held {
			others = append(others, ci.Timestamp())
		} else if _, err := dr.BlobReader().GetMetadata(ctx, ci.PackBlobID); !errors.Is(err, blob.ErrBlobNotFound) {
			// Held, or the storage cannot say: it may be in the way.
			others = append(others, ci.Timestamp())
		}
		return nil
	})
	if err != nil {
		return remaining, fmt.Errorf("read the index's deleted contents: %w", err)
	}
	if len(still) == 0 {
		return nil, nil // Kopia's maintenance already let go of them
	}
	for _, at := range others {
		// One deleted after the newest dropped content is not: the
		// watermark stops short of it.
		if !at.After(latest) {
			return still, nil
		}
	}
	if ahead := latest.Sub(clk.Now()); ahead > 0 {
		clk.Sleep(ahead)
	}
	err = repo.DirectWriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup integrity: forget lost contents"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			_, err := w.ContentManager().CompactIndexes(ctx, indexblob.CompactOptions{DropDeletedBefore: latest})
			return err
		})
	if err != nil {
		return still, fmt.Errorf("move the deletion watermark to %s: %w", latest.UTC().Format(time.RFC3339), err)
	}
	if err := dr.Refresh(ctx); err != nil {
		return nil, fmt.Errorf("refresh the index after moving the deletion watermark: %w", err)
	}
	return nil, nil
}

// forgetLegacy drops the pending contents from an index of Kopia's format
// before epochs, whose compaction drops named contents.
func forgetLegacy(ctx context.Context, dr repo.DirectRepository, pending map[content.ID]loss) error {
	ids := make([]content.ID, 0, len(pending))
	for id := range pending {
		ids = append(ids, id)
	}
	err := repo.DirectWriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup integrity: forget lost contents"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			_, err := w.ContentManager().CompactIndexes(ctx, indexblob.CompactOptions{AllIndexes: true, DropContents: ids})
			return err
		})
	if err != nil {
		return fmt.Errorf("drop lost contents from the index: %w", err)
	}
	if err := dr.Refresh(ctx); err != nil {
		return fmt.Errorf("refresh the index after dropping lost contents: %w", err)
	}
	return nil
}
