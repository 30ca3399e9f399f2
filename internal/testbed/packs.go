package testbed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/snapshotfs"
)

// DataPacks are the data packs ("p…") holding the files at the top of the
// latest snapshot of user@host:path, read through r: what a spec deletes
// or rots through the storage's own API to lose that snapshot's data.
func DataPacks(ctx context.Context, r repo.DirectRepository, user, host, path string) ([]blob.ID, error) {
	if err := r.Refresh(ctx); err != nil {
		return nil, err
	}
	ms, err := snapshot.ListSnapshots(ctx, r, snapshot.SourceInfo{UserName: user, Host: host, Path: path})
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("no snapshot of %s@%s:%s", user, host, path)
	}
	latest := slices.MaxFunc(ms, func(a, b *snapshot.Manifest) int { return a.StartTime.ToTime().Compare(b.StartTime.ToTime()) })
	iter, err := snapshotfs.DirectoryEntry(r, latest.RootObjectID(), nil).Iterate(ctx)
	if err != nil {
		return nil, err
	}
	defer iter.Close()
	var packs []blob.ID
	for {
		e, err := iter.Next(ctx)
		if err != nil {
			return nil, err
		}
		if e == nil {
			break
		}
		ids, err := object.VerifyObject(ctx, contentSource{r}, e.(object.HasObjectID).ObjectID())
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			ci, err := r.ContentReader().ContentInfo(ctx, id)
			if err != nil {
				return nil, err
			}
			if strings.HasPrefix(string(ci.PackBlobID), string(content.PackBlobIDPrefixRegular)) && !slices.Contains(packs, ci.PackBlobID) {
				packs = append(packs, ci.PackBlobID)
			}
		}
	}
	slices.Sort(packs)
	return packs, nil
}

// contentSource reads a repository's contents as package object does.
type contentSource struct{ repo.DirectRepository }

func (c contentSource) GetContent(ctx context.Context, id content.ID) ([]byte, error) {
	return c.ContentReader().GetContent(ctx, id)
}

// RotBlob flips 9 runs of 64 bytes spread over blob id of st, as issue
// 48's reproduction did: its name and length stay, what it holds no
// longer decrypts.
func RotBlob(ctx context.Context, st blob.Storage, id blob.ID) error {
	var data blobBuffer
	if err := st.GetBlob(ctx, id, 0, -1, &data); err != nil {
		return err
	}
	raw := data.Bytes()
	for i := range 9 {
		at := (i + 1) * len(raw) / 11
		for j := at; j < at+64 && j < len(raw); j++ {
			raw[j] ^= 0xff
		}
	}
	return st.PutBlob(ctx, id, blobBytes(raw), blob.PutOptions{})
}

// blobBuffer is a bytes.Buffer as blob.Storage writes into.
type blobBuffer struct{ bytes.Buffer }

func (b *blobBuffer) Length() int { return b.Len() }

// blobBytes is data as blob.Storage's PutBlob takes it.
type blobBytes []byte

func (b blobBytes) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b)
	return int64(n), err
}

func (b blobBytes) Length() int { return len(b) }

func (b blobBytes) Reader() io.ReadSeekCloser { return nopReadCloser{bytes.NewReader(b)} }

type nopReadCloser struct{ *bytes.Reader }

func (nopReadCloser) Close() error { return nil }
