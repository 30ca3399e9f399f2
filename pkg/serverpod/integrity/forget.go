package integrity

import (
	"context"
	"fmt"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/content/indexblob"
	"github.com/kopia/kopia/repo/manifest"
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
// what Kopia's garbage collection deleted meanwhile, which Kopia keeps
// until its safety margins pass, so that a snapshot that was running
// while it collected can still have its contents undeleted. forget moves
// it only when no such entry is in its way, that is when every deleted
// entry it would drop (deleted at or before the newest dropped content)
// is one the verifier dropped, one whose pack the storage no longer holds
// (nothing left to undelete), or a manifest content. Otherwise the dropped
// contents wait, counted in the state as pending, until Kopia's own
// maintenance moves the watermark past its entries.
//
// Manifest contents are never undeleted: Kopia's manifest manager deletes
// them when it compacts them (once there are 16; every snapshot adds one)
// after writing their entries into a new content, its garbage collection
// leaves them alone, and a reader that lost a race with a compaction
// loads the manifests again. Counting them would keep the watermark still
// in any repository with a few snapshots, and the lost contents present
// to the guests' clients for days.

// forget makes the pending dropped contents absent from the index, and
// returns those it could not yet: pending when something is in the way,
// none otherwise.
func forget(ctx context.Context, dr repo.DirectRepository, stored map[blob.ID]int64, pending map[content.ID]bool) (map[content.ID]bool, error) {
	if len(pending) == 0 {
		return pending, nil
	}
	em, ok, err := dr.ContentReader().EpochManager(ctx)
	if err != nil {
		return pending, fmt.Errorf("read the index's epochs: %w", err)
	}
	if !ok {
		if err := forgetLegacy(ctx, dr, pending); err != nil {
			return pending, err
		}
		return nil, nil
	}
	cs, err := em.Current(ctx)
	if err != nil {
		return pending, fmt.Errorf("read the deletion watermark: %w", err)
	}
	var latest time.Time
	// others are the deletion times of the entries that could be in the
	// way: known once latest is.
	var others []time.Time
	remaining := map[content.ID]bool{}
	err = dr.ContentReader().IterateContents(ctx, content.IterateOptions{IncludeDeleted: true}, func(ci content.Info) error {
		if !ci.Deleted || !ci.Timestamp().After(cs.DeletionWatermark) {
			return nil
		}
		if pending[ci.ContentID] {
			remaining[ci.ContentID] = true
			if ci.Timestamp().After(latest) {
				latest = ci.Timestamp()
			}
			return nil
		}
		if ci.ContentID.Prefix() == manifest.ContentPrefix {
			return nil
		}
		if _, held := stored[ci.PackBlobID]; held {
			others = append(others, ci.Timestamp())
		}
		return nil
	})
	if err != nil {
		return pending, fmt.Errorf("read the index's deleted contents: %w", err)
	}
	if len(remaining) == 0 {
		return nil, nil // Kopia's maintenance already let go of them
	}
	for _, at := range others {
		// Deleted after the newest dropped content: the watermark stops
		// short of it.
		if !at.After(latest) {
			return remaining, nil
		}
	}
	err = repo.DirectWriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup integrity: forget lost contents"},
		func(ctx context.Context, w repo.DirectRepositoryWriter) error {
			_, err := w.ContentManager().CompactIndexes(ctx, indexblob.CompactOptions{DropDeletedBefore: latest})
			return err
		})
	if err != nil {
		return remaining, fmt.Errorf("move the deletion watermark to %s: %w", latest.UTC().Format(time.RFC3339), err)
	}
	if err := dr.Refresh(ctx); err != nil {
		return nil, fmt.Errorf("refresh the index after moving the deletion watermark: %w", err)
	}
	return nil, nil
}

// forgetLegacy drops the pending contents from an index of Kopia's format
// before epochs, whose compaction drops named contents.
func forgetLegacy(ctx context.Context, dr repo.DirectRepository, pending map[content.ID]bool) error {
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
