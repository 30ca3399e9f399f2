package integrity_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/snapshotfs"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/rehash"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
)

// bed is a real Kopia server on a filesystem repository with guestbackup's
// access rules, two guests' kopia clients, and the maintenance owner's two
// connections a server pod verifies with.
type bed struct {
	t        *testing.T
	srv      *testbed.KopiaServer
	storage  blob.Storage
	owner    repo.DirectRepository
	uncached repo.DirectRepository
	web, db  *testbed.KopiaClient
	reports  *reports
	verifier *integrity.Verifier
}

type reports []string

func (r *reports) Report(warning bool, reason, message string) {
	kind := "Normal"
	if warning {
		kind = "Warning"
	}
	*r = append(*r, kind+" "+reason+": "+message)
}

func (r *reports) take() []string {
	out := *r
	*r = nil
	return out
}

func newBed(t *testing.T) *bed {
	t.Helper()
	ctx := context.Background()
	b := &bed{t: t, srv: testbed.StartKopiaServer(t, testbed.KopiaServerOptions{}), reports: &reports{}}
	st, err := filesystem.New(ctx, &filesystem.Options{Path: b.srv.RepoPath}, false)
	if err != nil {
		t.Fatal(err)
	}
	b.storage = st
	config := filepath.Join(t.TempDir(), "owner.config")
	if err := repo.Connect(ctx, config, st, b.srv.RepoPassword, &repo.ConnectOptions{
		ClientOptions: repo.ClientOptions{Username: "guestbackup-maintenance", Hostname: "main.backup"},
	}); err != nil {
		t.Fatal(err)
	}
	r, err := repo.Open(ctx, config, b.srv.RepoPassword, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(ctx) })
	b.owner = r.(repo.DirectRepository)
	if b.uncached, err = integrity.OpenUncached(ctx, config, b.srv.RepoPassword); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.uncached.Close(ctx) })
	if _, err := kopiauser.SyncACLs(ctx, b.owner, kopiauser.DefaultACLs()); err != nil {
		t.Fatal(err)
	}
	b.web, b.db = b.guest("web@team-a"), b.guest("db@team-a")
	b.verifier = integrity.NewVerifier(integrity.Options{
		Repository: b.owner, Reader: b.uncached, ReadBytesPerPass: 1 << 30,
		Server: b.srv, Reports: b.reports, Log: testr.New(t),
	})
	return b
}

// guest adds user@host to the repository and connects a client as it.
func (b *bed) guest(name string) *testbed.KopiaClient {
	b.t.Helper()
	password := testbed.RandomPassword()
	b.srv.AddUser(b.t, name, password)
	c := testbed.NewKopiaClient(b.t)
	if out, err := c.Connect(context.Background(), b.srv.URL, b.srv.CA.CertPEM(), name, password); err != nil {
		b.t.Fatalf("connect %s: %v\n%s", name, err, out)
	}
	return c
}

func (b *bed) kopia(c *testbed.KopiaClient, args ...string) string {
	b.t.Helper()
	out, err := c.Run(context.Background(), args...)
	if err != nil {
		b.t.Fatalf("kopia %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// files writes n files of size random bytes into a new folder.
func files(t *testing.T, n, size int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		if err := os.WriteFile(filepath.Join(dir, "file"+string(rune('a'+i))), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// verifies is whether `snapshot verify` reads every file of path's
// snapshots back, as the guest.
func (b *bed) verifies(c *testbed.KopiaClient, path string) (bool, string) {
	out, err := c.Run(context.Background(), "snapshot", "verify", "--verify-files-percent=100", "--sources="+path)
	return err == nil, out
}

// dataPacks are the packs holding the file data of the latest snapshot
// of user@host:path, read through the owner's connection.
func (b *bed) dataPacks(user, host, path string) []blob.ID {
	b.t.Helper()
	ctx := context.Background()
	if err := b.owner.Refresh(ctx); err != nil {
		b.t.Fatal(err)
	}
	ms, err := snapshot.ListSnapshots(ctx, b.owner, snapshot.SourceInfo{UserName: user, Host: host, Path: path})
	if err != nil || len(ms) == 0 {
		b.t.Fatalf("snapshots of %s@%s:%s: %v %d", user, host, path, err, len(ms))
	}
	slices.SortFunc(ms, func(a, c *snapshot.Manifest) int { return a.StartTime.ToTime().Compare(c.StartTime.ToTime()) })
	root := snapshotfs.DirectoryEntry(b.owner, ms[len(ms)-1].RootObjectID(), nil)
	var packs []blob.ID
	iter, err := root.Iterate(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	defer iter.Close()
	for {
		e, err := iter.Next(ctx)
		if err != nil {
			b.t.Fatal(err)
		}
		if e == nil {
			break
		}
		oid := e.(object.HasObjectID).ObjectID()
		ids, err := object.VerifyObject(ctx, contentsOf{b.owner}, oid)
		if err != nil {
			b.t.Fatal(err)
		}
		for _, id := range ids {
			ci, err := b.owner.ContentReader().ContentInfo(ctx, id)
			if err != nil {
				b.t.Fatal(err)
			}
			if strings.HasPrefix(string(ci.PackBlobID), string(content.PackBlobIDPrefixRegular)) && !slices.Contains(packs, ci.PackBlobID) {
				packs = append(packs, ci.PackBlobID)
			}
		}
	}
	slices.Sort(packs)
	return packs
}

type contentsOf struct{ repo.DirectRepository }

func (c contentsOf) GetContent(ctx context.Context, id content.ID) ([]byte, error) {
	return c.ContentReader().GetContent(ctx, id)
}

func (b *bed) pass() maintenancestate.IntegrityState {
	b.t.Helper()
	s, err := b.verifier.Pass(context.Background())
	if err != nil {
		b.t.Fatalf("pass: %v", err)
	}
	return s
}

// notices is what a guest's `kopia manifest list` shows of rehash notices:
// what the guest's snapshot script reads.
func (b *bed) notices(c *testbed.KopiaClient) string {
	return strings.TrimSpace(b.kopia(c, "manifest", "list", "--filter=type:"+rehash.ManifestType))
}

// TestALostPackIsFoundAndHealedForward is issue 48.1 on a real Kopia
// server with real kopia guests: the storage loses the pack holding one
// path's data; without verification the guest's next snapshot "succeeds"
// and cannot be read back; a pass names the pack, the damaged snapshots and
// their guest, and tells the guest's client to read its files again; the
// snapshot that does uploads what was lost, and every snapshot of the
// same data reads back again.
func TestALostPackIsFoundAndHealedForward(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	lost, kept := files(t, 4, 2<<20), files(t, 3, 1<<20)
	b.kopia(b.web, "snapshot", "create", lost)
	b.kopia(b.web, "snapshot", "create", kept)
	b.kopia(b.db, "snapshot", "create", files(t, 2, 1<<20))

	s := b.pass()
	if s.LostContents != 0 || s.DamagedSnapshots != 0 || s.Contents == 0 || s.ReadBytes == 0 {
		t.Fatalf("an intact repository: %+v", s)
	}

	packs := b.dataPacks("web", "team-a", lost)
	for _, p := range packs {
		if err := b.storage.DeleteBlob(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// What the issue found: the next snapshot of the same files succeeds
	// and cannot be read back.
	b.kopia(b.web, "snapshot", "create", lost)
	if ok, out := b.verifies(b.web, lost); ok {
		t.Fatalf("the snapshots of %s verify with their pack deleted:\n%s", lost, out)
	}

	s = b.pass()
	if s.LostContents == 0 || !slices.Equal(toIDs(s.MissingPacks), packs) || len(s.DamagedPacks) != 0 {
		t.Fatalf("the pass found lost %d contents, missing packs %v (deleted %v), damaged %v", s.LostContents, s.MissingPacks, packs, s.DamagedPacks)
	}
	if s.DamagedSnapshots != 2 || len(s.Damaged) != 1 {
		t.Fatalf("damaged: %d snapshots %+v, want the 2 snapshots of %s only", s.DamagedSnapshots, s.Damaged, lost)
	}
	d := s.Damaged[0]
	if d.User != "web" || d.Host != "team-a" || d.Path != lost || d.Snapshots != 2 || d.Files != 4 || !d.Healing || len(d.IDs) != 2 {
		t.Fatalf("damaged source: %+v", d)
	}
	if r := b.reports.take(); len(r) != 1 || !strings.HasPrefix(r[0], "Warning RepositoryDamaged: ") || !strings.Contains(r[0], string(packs[0])) {
		t.Fatalf("reports: %q", r)
	}
	if ok, out := b.verifies(b.web, kept); !ok {
		t.Fatalf("the snapshot of %s shared no pack with the loss, yet does not verify:\n%s", kept, out)
	}

	// The guest, and only it, reads its notice.
	if n := b.notices(b.web); n == "" {
		t.Fatal("web@team-a sees no rehash notice")
	}
	if n := b.notices(b.db); n != "" {
		t.Fatalf("db@team-a sees another guest's notice: %s", n)
	}

	// A plain snapshot still builds on the damaged one.
	b.kopia(b.web, "snapshot", "create", lost)
	if s = b.pass(); s.DamagedSnapshots != 3 || !s.Damaged[0].Healing {
		t.Fatalf("after a snapshot that did not read its files again: %+v", s.Damaged)
	}

	// What the guest's script does while it has a notice.
	b.kopia(b.web, "snapshot", "create", "--force-hash=100", lost)
	if ok, out := b.verifies(b.web, lost); !ok {
		t.Fatalf("after a snapshot that read every file again, the snapshots of %s do not verify:\n%s", lost, out)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	ids, err := b.web.SnapshotIDs(ctx, lost)
	if err != nil {
		t.Fatal(err)
	}
	b.kopia(b.web, "snapshot", "restore", ids[0], restored)
	for _, name := range []string{"filea", "fileb", "filec", "filed"} {
		want, _ := os.ReadFile(filepath.Join(lost, name))
		got, err := os.ReadFile(filepath.Join(restored, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("the first snapshot's %s does not restore byte for byte: %v", name, err)
		}
	}

	s = b.pass()
	if s.DamagedSnapshots != 0 || len(s.Damaged) != 0 || s.LostContents != 0 || !s.DamagedSince.IsZero() {
		t.Fatalf("after healing: %+v", s)
	}
	if r := b.reports.take(); len(r) != 1 || !strings.HasPrefix(r[0], "Normal RepositoryIntactAgain: ") {
		t.Fatalf("reports after healing: %q", r)
	}
	if n := b.notices(b.web); n != "" {
		t.Fatalf("the notice outlived the damage: %s", n)
	}
}

// TestALostPackIsForgottenWhereManifestsWereCompacted: Kopia's manifest
// manager compacts its manifest contents once there are 16 of them (every
// snapshot and every user adds one), deleting the old ones while their
// packs stay in the storage. Those deleted entries must not keep the
// verifier from making the lost contents absent from the index: the
// guest's client would take them for present and never upload them again.
func TestALostPackIsForgottenWhereManifestsWereCompacted(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	lost := files(t, 2, 1<<20)
	b.kopia(b.web, "snapshot", "create", lost)
	compactManifests(t, b)

	packs := b.dataPacks("web", "team-a", lost)
	for _, p := range packs {
		if err := b.storage.DeleteBlob(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	s := b.pass()
	if s.LostContents == 0 || s.Pending != 0 {
		t.Fatalf("lost %d contents, %d still pending: the compacted manifests kept them in the index", s.LostContents, s.Pending)
	}
	b.kopia(b.web, "snapshot", "create", "--force-hash=100", lost)
	if ok, out := b.verifies(b.web, lost); !ok {
		t.Fatalf("after a snapshot that read every file again:\n%s", out)
	}
	if s := b.pass(); s.DamagedSnapshots != 0 {
		t.Fatalf("after healing: %+v", s.Damaged)
	}
}

// TestALostPackWaitsForWhatKopiasCollectionDeleted: a data content
// Kopia's garbage collection deleted before the loss, whose pack the
// storage still holds, may yet be undeleted by a snapshot that was running
// while it collected: the verifier keeps it in the index, and says the
// lost contents are pending until Kopia's maintenance lets go of it.
func TestALostPackWaitsForWhatKopiasCollectionDeleted(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	lost, collected := files(t, 2, 1<<20), files(t, 1, 1<<20)
	b.kopia(b.web, "snapshot", "create", lost)
	b.kopia(b.web, "snapshot", "create", collected)
	ids := map[content.ID]bool{}
	for _, p := range b.dataPacks("web", "team-a", collected) {
		if err := b.owner.ContentReader().IterateContents(ctx, content.IterateOptions{}, func(ci content.Info) error {
			if ci.PackBlobID == p {
				ids[ci.ContentID] = true
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	err := repo.DirectWriteSession(ctx, b.owner, repo.WriteSessionOptions{Purpose: "spec: collect"}, func(ctx context.Context, w repo.DirectRepositoryWriter) error {
		for id := range ids {
			if err := w.ContentManager().DeleteContent(ctx, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || len(ids) == 0 {
		t.Fatalf("delete %d contents as Kopia's collection does: %v", len(ids), err)
	}
	// Kopia stamps a deletion at least a second after the content's
	// write, in whole seconds: the loss is dropped once the clock has
	// passed the collection's stamps, as it has in a repository whose
	// collection ran before the loss was found.
	collectedAt := deletedAt(t, b, ids)
	for !time.Now().After(collectedAt.Add(time.Second)) {
		time.Sleep(100 * time.Millisecond)
	}

	for _, p := range b.dataPacks("web", "team-a", lost) {
		if err := b.storage.DeleteBlob(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if s := b.pass(); s.LostContents == 0 || s.Pending != s.LostContents {
		t.Fatalf("lost %d contents, %d pending: the watermark moved past what Kopia's collection deleted", s.LostContents, s.Pending)
	}
	if at := deletedAt(t, b, ids); at.IsZero() {
		t.Fatal("the contents Kopia's collection deleted are gone from the index: a snapshot running meanwhile could no longer undelete them")
	}
}

// deletedAt is when the contents ids were deleted, the latest stamp; zero
// when one is not in the index as deleted.
func deletedAt(t *testing.T, b *bed, ids map[content.ID]bool) time.Time {
	t.Helper()
	ctx := context.Background()
	if err := b.owner.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	var latest time.Time
	found := 0
	if err := b.owner.ContentReader().IterateContents(ctx, content.IterateOptions{IncludeDeleted: true}, func(ci content.Info) error {
		if ids[ci.ContentID] && ci.Deleted {
			found++
			if ci.Timestamp().After(latest) {
				latest = ci.Timestamp()
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if found != len(ids) {
		return time.Time{}
	}
	return latest
}

// compactManifests writes manifests in sessions of their own until Kopia's
// manifest manager compacts them, and checks that it left deleted manifest
// contents in packs the storage still holds.
func compactManifests(t *testing.T, b *bed) {
	t.Helper()
	ctx := context.Background()
	for i := range 20 {
		err := repo.WriteSession(ctx, b.owner, repo.WriteSessionOptions{Purpose: "spec: fill manifests"}, func(ctx context.Context, w repo.RepositoryWriter) error {
			_, err := w.PutManifest(ctx, map[string]string{"type": "spec-filler", "n": strconv.Itoa(i)}, struct{}{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.owner.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		// Loading the manifests is what compacts them.
		if _, err := b.owner.FindManifests(ctx, map[string]string{"type": "spec-filler"}); err != nil {
			t.Fatal(err)
		}
	}
	stored := map[blob.ID]bool{}
	if err := b.storage.ListBlobs(ctx, content.PackBlobIDPrefixSpecial, func(m blob.Metadata) error {
		stored[m.BlobID] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	deleted := 0
	if err := b.owner.ContentReader().IterateContents(ctx, content.IterateOptions{IncludeDeleted: true}, func(ci content.Info) error {
		if ci.Deleted && strings.HasPrefix(string(ci.ContentID.Prefix()), "m") && stored[ci.PackBlobID] {
			deleted++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if deleted == 0 {
		t.Fatal("Kopia compacted no manifest contents: the spec proves nothing")
	}
}

// TestARottenPackIsFound: bytes flipped inside a pack are found by
// reading it back, through a connection whose cache cannot hide them,
// and only the contents that do not read back are dropped.
func TestARottenPackIsFound(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	rotten, kept := files(t, 3, 1<<20), files(t, 3, 1<<20)
	b.kopia(b.web, "snapshot", "create", rotten)
	b.kopia(b.db, "snapshot", "create", kept)
	// A first pass reads every pack through the uncached connection.
	if s := b.pass(); s.LostContents != 0 || s.ReadPacks == 0 {
		t.Fatalf("an intact repository: %+v", s)
	}

	packs := b.dataPacks("web", "team-a", rotten)
	var data outputBuffer
	if err := b.storage.GetBlob(ctx, packs[0], 0, -1, &data); err != nil {
		t.Fatal(err)
	}
	raw := data.Bytes()
	// 9 runs of 64 bytes, as the reproduction flipped.
	for i := range 9 {
		at := (i + 1) * len(raw) / 11
		for j := at; j < at+64 && j < len(raw); j++ {
			raw[j] ^= 0xff
		}
	}
	if err := b.storage.PutBlob(ctx, packs[0], bytesOf(raw), blob.PutOptions{}); err != nil {
		t.Fatal(err)
	}

	s := b.pass()
	if s.LostContents == 0 || len(s.MissingPacks) != 0 || !slices.Equal(toIDs(s.DamagedPacks), packs[:1]) {
		t.Fatalf("the pass found lost %d, missing %v, damaged %v (rotted %s)", s.LostContents, s.MissingPacks, s.DamagedPacks, packs[0])
	}
	if s.DamagedSnapshots != 1 || s.Damaged[0].Path != rotten || s.Damaged[0].Files == 0 || s.Damaged[0].Files > 3 {
		t.Fatalf("damaged: %+v", s.Damaged)
	}
	if ok, out := b.verifies(b.db, kept); !ok {
		t.Fatalf("%s shared no pack with the rot, yet does not verify:\n%s", kept, out)
	}
	b.kopia(b.web, "snapshot", "create", "--force-hash=100", rotten)
	if ok, out := b.verifies(b.web, rotten); !ok {
		t.Fatalf("after a snapshot that read every file again:\n%s", out)
	}
	if s := b.pass(); s.DamagedSnapshots != 0 {
		t.Fatalf("after healing: %+v", s.Damaged)
	}
}

func toIDs(s []string) []blob.ID {
	out := make([]blob.ID, len(s))
	for i, x := range s {
		out[i] = blob.ID(x)
	}
	slices.Sort(out)
	return out
}

type outputBuffer struct{ bytes.Buffer }

func (b *outputBuffer) Length() int { return b.Len() }

// bytesOf is data as blob.Storage's PutBlob takes it.
func bytesOf(data []byte) blob.Bytes { return byteSlice(data) }

type byteSlice []byte

func (b byteSlice) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b)
	return int64(n), err
}

func (b byteSlice) Length() int { return len(b) }

func (b byteSlice) Reader() io.ReadSeekCloser { return nopCloser{bytes.NewReader(b)} }

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }
