package integrity

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/content"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// What a suspect or a loss is.
const (
	whyMissing   = "missing"
	whyTruncated = "truncated"
	whyDamaged   = "damaged"
)

// suspect is a content a pass could not find whole: its pack is missing
// or too short, or it did not read back.
type suspect struct {
	id   content.ID
	pack blob.ID
	why  string
}

// inventory is what the index names and the storage holds.
type inventory struct {
	contents int
	// packs holds, for each pack the index names, the bytes of its
	// contents; stored, each pack's length in the storage.
	packs  map[blob.ID]int64
	stored map[blob.ID]int64
	lost   []suspect
}

// takeInventory lists the storage's packs and checks that every content
// the index names lies within one of them.
func takeInventory(ctx context.Context, dr repo.DirectRepository) (*inventory, error) {
	inv := &inventory{packs: map[blob.ID]int64{}, stored: map[blob.ID]int64{}}
	// The prefixes are listed in parallel, so the callback runs
	// concurrently.
	var mu sync.Mutex
	err := blob.IterateAllPrefixesInParallel(ctx, len(content.PackBlobIDPrefixes), dr.BlobReader(), content.PackBlobIDPrefixes,
		func(m blob.Metadata) error {
			mu.Lock()
			defer mu.Unlock()
			inv.stored[m.BlobID] = m.Length
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("list the storage's packs: %w", err)
	}
	// A content the index names was in its pack before the index blob
	// naming it was written. The iteration may read index blobs newer
	// than the listing: what it then finds missing, confirm checks
	// against the storage pack by pack.
	err = dr.ContentReader().IterateContents(ctx, content.IterateOptions{}, func(ci content.Info) error {
		inv.contents++
		inv.packs[ci.PackBlobID] += int64(ci.PackedLength)
		length, ok := inv.stored[ci.PackBlobID]
		switch {
		case !ok:
			inv.lost = append(inv.lost, suspect{id: ci.ContentID, pack: ci.PackBlobID, why: whyMissing})
		case int64(ci.PackOffset)+int64(ci.PackedLength) > length:
			inv.lost = append(inv.lost, suspect{id: ci.ContentID, pack: ci.PackBlobID, why: whyTruncated})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the index: %w", err)
	}
	return inv, nil
}

// suspects are the contents the inventory found not whole.
func (inv *inventory) suspects() []suspect { return slices.Clone(inv.lost) }

// readResult is what reading packs back found.
type readResult struct {
	packs    int
	bytes    int64
	suspects []suspect
}

// readBack reads the contents of the packs choosePacks picks through the
// uncached Reader, and advances the cursor.
func (v *Verifier) readBack(ctx context.Context, inv *inventory) (readResult, error) {
	var res readResult
	present := make([]blob.ID, 0, len(inv.packs))
	for p := range inv.packs {
		if _, ok := inv.stored[p]; ok {
			present = append(present, p)
		}
	}
	slices.Sort(present)
	chosen, cursor := choosePacks(present, inv.packs, blob.ID(v.cursor), v.opts.ReadBytesPerPass)
	if len(chosen) == 0 {
		return res, nil
	}
	if err := v.opts.Reader.Refresh(ctx); err != nil {
		return res, fmt.Errorf("refresh the uncached connection's index: %w", err)
	}
	picked := map[blob.ID]bool{}
	for _, p := range chosen {
		picked[p] = true
	}
	var contents []content.Info
	err := v.opts.Repository.ContentReader().IterateContents(ctx, content.IterateOptions{}, func(ci content.Info) error {
		if picked[ci.PackBlobID] {
			contents = append(contents, ci)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("read the index: %w", err)
	}
	for _, ci := range contents {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		res.bytes += int64(ci.PackedLength)
		if _, err := v.opts.Reader.ContentReader().GetContent(ctx, ci.ContentID); err != nil {
			res.suspects = append(res.suspects, suspect{id: ci.ContentID, pack: ci.PackBlobID, why: whyDamaged})
		}
	}
	res.packs = len(chosen)
	readBytes.Add(float64(res.bytes))
	v.cursor = string(cursor)
	return res, nil
}

// choosePacks picks, from the sorted packs, those after cursor (wrapping
// around) until their bytes reach budget, and returns the new cursor: the
// last pack picked. It picks at least one pack while budget is positive,
// and no pack twice.
func choosePacks(sorted []blob.ID, sizes map[blob.ID]int64, cursor blob.ID, budget int64) ([]blob.ID, blob.ID) {
	if budget <= 0 || len(sorted) == 0 {
		return nil, cursor
	}
	start := sort.Search(len(sorted), func(i int) bool { return sorted[i] > cursor })
	var chosen []blob.ID
	var total int64
	for i := range sorted {
		p := sorted[(start+i)%len(sorted)]
		chosen = append(chosen, p)
		total += sizes[p]
		if total >= budget {
			break
		}
	}
	return chosen, chosen[len(chosen)-1]
}

// loss is a content confirmed lost: its pack, and the end of its bytes
// there.
type loss struct {
	id   content.ID
	pack blob.ID
	end  int64
	why  string
}

// losses are the contents a pass confirmed lost.
type losses []loss

// packs are the packs missing (or too short) and the packs damaged, at
// most maintenancestate.MaxListedPacks of each.
func (l losses) packs() (missing, damaged []string) {
	seen := map[blob.ID]bool{}
	for _, x := range l {
		if seen[x.pack] {
			continue
		}
		seen[x.pack] = true
		if x.why == whyDamaged {
			if len(damaged) < maintenancestate.MaxListedPacks {
				damaged = append(damaged, string(x.pack))
			}
		} else if len(missing) < maintenancestate.MaxListedPacks {
			missing = append(missing, string(x.pack))
		}
	}
	return missing, damaged
}

// confirm keeps the suspects that are lost against a fresh index and the
// storage's own answer: a content compaction moved, or that was deleted,
// meanwhile is not lost, and neither is one whose read failed for a
// passing reason. A storage that does not answer fails the pass, so that
// trouble reaching it never drops a content.
func (v *Verifier) confirm(ctx context.Context, suspects []suspect) (losses, error) {
	if len(suspects) == 0 {
		return nil, nil
	}
	dr := v.opts.Repository
	if err := dr.Refresh(ctx); err != nil {
		return nil, fmt.Errorf("refresh the index: %w", err)
	}
	var lost losses
	for _, s := range suspects {
		ci, err := dr.ContentReader().ContentInfo(ctx, s.id)
		switch {
		case errors.Is(err, content.ErrContentNotFound):
			continue
		case err != nil:
			return nil, fmt.Errorf("content %s: %w", s.id, err)
		case ci.Deleted:
			continue
		}
		end := int64(ci.PackOffset) + int64(ci.PackedLength)
		md, err := dr.BlobReader().GetMetadata(ctx, ci.PackBlobID)
		switch {
		case errors.Is(err, blob.ErrBlobNotFound):
			lost = append(lost, loss{id: s.id, pack: ci.PackBlobID, end: end, why: whyMissing})
			continue
		case err != nil:
			return nil, fmt.Errorf("pack %s of content %s: %w", ci.PackBlobID, s.id, err)
		case end > md.Length:
			lost = append(lost, loss{id: s.id, pack: ci.PackBlobID, end: end, why: whyTruncated})
			continue
		}
		if s.why != whyDamaged || v.opts.Reader == nil {
			continue // its pack is back, whole
		}
		damaged, err := v.stillDamaged(ctx, ci)
		if err != nil {
			return nil, err
		}
		if damaged {
			lost = append(lost, loss{id: s.id, pack: ci.PackBlobID, end: end, why: whyDamaged})
		}
	}
	return lost, nil
}

// stillDamaged reads ci's bytes from the storage (which must answer) and
// the content through the uncached Reader again: damaged only if the
// storage gave its bytes and they still do not decrypt.
func (v *Verifier) stillDamaged(ctx context.Context, ci content.Info) (bool, error) {
	var raw outputBuffer
	if err := v.opts.Repository.BlobReader().GetBlob(ctx, ci.PackBlobID, int64(ci.PackOffset), int64(ci.PackedLength), &raw); err != nil {
		return false, fmt.Errorf("read content %s from pack %s: %w", ci.ContentID, ci.PackBlobID, err)
	}
	_, err := v.opts.Reader.ContentReader().GetContent(ctx, ci.ContentID)
	switch {
	case err == nil:
		return false, nil
	case undecodable(err):
		// The storage gave the bytes, and they do not decrypt.
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	default:
		// Not found (the uncached index lags), a timeout, throttling:
		// nothing says the data is bad, and dropping it would lose it.
		return false, fmt.Errorf("read content %s back: %w", ci.ContentID, err)
	}
}

// outputBuffer is a bytes.Buffer as blob.Storage writes into.
type outputBuffer struct{ bytes.Buffer }

// Length is how many bytes it holds.
func (b *outputBuffer) Length() int { return b.Len() }
