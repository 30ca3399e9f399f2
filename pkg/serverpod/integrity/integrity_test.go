package integrity_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
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
	kopiamaintenance "github.com/kopia/kopia/repo/maintenance"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/rehash"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
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
	// passwords are the guests' own, by user@host.
	passwords map[string]string
	reports   *reports
	verifier  *integrity.Verifier
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
	b := &bed{t: t, srv: testbed.StartKopiaServer(t, testbed.KopiaServerOptions{}), reports: &reports{}, passwords: map[string]string{}}
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
	b.passwords[name] = password
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

// dataPacks are the data packs of the latest snapshot of user@host:path.
func (b *bed) dataPacks(user, host, path string) []blob.ID {
	b.t.Helper()
	packs, err := testbed.DataPacks(context.Background(), b.owner, user, host, path)
	if err != nil {
		b.t.Fatal(err)
	}
	return packs
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

// TestALostPackIsFoundAndHealedForward proves verification (docs/design.md,
// decision 27) on a real Kopia server with real kopia guests: the storage
// loses the pack holding one path's data; without verification the guest's
// next snapshot "succeeds" and cannot be read back; a pass names the pack,
// the damaged snapshots and their guest, and tells the guest's client to
// read its files again; the snapshot that does uploads what was lost, and
// every snapshot of the same data reads back again.
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
	// Why verification is needed: the next snapshot of the same files
	// succeeds and cannot be read back.
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

	// Kopia's garbage collection fails on a reference to data that is
	// gone: it must not stay that way.
	if _, err := maintenanceRun(t, b.owner); err == nil || !strings.Contains(err.Error(), "snapshot gc") {
		t.Fatalf("full maintenance while snapshots reference lost data: %v; want garbage collection to fail", err)
	}

	// The owner changed one file before the guest read its files again:
	// the earlier snapshots' version of it is gone for good.
	oldD, _ := os.ReadFile(filepath.Join(lost, "filed"))
	if err := os.WriteFile(filepath.Join(lost, "filed"), []byte("changed"), 0o600); err != nil {
		t.Fatal(err)
	}
	// What the guest's script does while it has a notice.
	b.kopia(b.web, "snapshot", "create", "--force-hash=100", lost)
	s = b.pass()
	if s.DamagedSnapshots != 0 || len(s.Damaged) != 0 || s.LostContents != 0 || !s.DamagedSince.IsZero() {
		t.Fatalf("after healing: %+v", s)
	}
	if len(s.Settled) != 1 || s.Settled[0].Snapshots != 3 || s.Settled[0].Files != 1 {
		t.Fatalf("settled: %+v; want the 3 snapshots that hold the lost version of filed", s.Settled)
	}
	if r := b.reports.take(); len(r) != 2 || !strings.HasPrefix(r[0], "Warning SnapshotsSettled: 3 damaged snapshots") || !strings.HasPrefix(r[1], "Normal RepositoryIntactAgain: ") {
		t.Fatalf("reports after healing: %q", r)
	}
	if n := b.notices(b.web); n != "" {
		t.Fatalf("the notice outlived the damage: %s", n)
	}
	if ok, out := b.verifies(b.web, lost); !ok {
		t.Fatalf("after the guest read every file again and the rest was settled, the snapshots of %s do not verify:\n%s", lost, out)
	}
	if _, err := maintenanceRun(t, b.owner); err != nil {
		t.Fatalf("full maintenance once nothing references lost data: %v", err)
	}
	// The first snapshot restores every file the guest uploaded again
	// byte for byte, and says what was lost for good.
	restored := filepath.Join(t.TempDir(), "restored")
	ids, err := b.web.SnapshotIDs(ctx, lost)
	if err != nil {
		t.Fatal(err)
	}
	b.kopia(b.web, "snapshot", "restore", ids[0], restored)
	for _, name := range []string{"filea", "fileb", "filec"} {
		want, _ := os.ReadFile(filepath.Join(lost, name))
		got, err := os.ReadFile(filepath.Join(restored, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("the first snapshot's %s does not restore byte for byte: %v", name, err)
		}
	}
	stub, err := os.ReadFile(filepath.Join(restored, ".INVALID.filed"))
	if err != nil || !strings.Contains(string(stub), "the storage lost this file's data") {
		t.Fatalf("the lost version of filed: %v\n%s", err, stub)
	}
	if _, err := os.Stat(filepath.Join(restored, "filed")); err == nil || len(oldD) == 0 {
		t.Fatal("the first snapshot restored a filed it cannot hold")
	}
}

// maintenanceRun runs Kopia's full maintenance as guestbackup's runner
// does, without Kopia's waits.
func maintenanceRun(t *testing.T, dr repo.DirectRepository) (maintenance.Result, error) {
	t.Helper()
	safety := kopiamaintenance.SafetyNone
	if err := claim(context.Background(), dr); err != nil {
		t.Fatal(err)
	}
	return maintenance.NewRunner(maintenance.Options{Repository: dr, Safety: &safety, Log: testr.New(t)}).RunOnce(context.Background(), kopiamaintenance.ModeFull)
}

// claim makes dr's identity the repository's maintenance owner: the
// test bed's server created it as another.
func claim(ctx context.Context, dr repo.DirectRepository) error {
	params, err := kopiamaintenance.GetParams(ctx, dr)
	if err != nil {
		return err
	}
	params.Owner = dr.ClientOptions().UsernameAtHost()
	return repo.WriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "test"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		return kopiamaintenance.SetParams(ctx, w, params)
	})
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
	if err := testbed.RotBlob(ctx, b.storage, packs[0]); err != nil {
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

// TestWhatGarbageCollectionDeletedRecentlyIsNotDropped: Kopia keeps a
// content its garbage collection deleted in the index for a while, so
// that a snapshot that was running meanwhile can have it undeleted.
// Moving the deletion watermark past the lost contents would drop it too,
// so the pass leaves the lost contents pending while it is in the way,
// and forgets them once nothing is left to undelete.
func TestWhatGarbageCollectionDeletedRecentlyIsNotDropped(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	lost := files(t, 2, 2<<20)
	b.kopia(b.web, "snapshot", "create", lost)
	// What garbage collection does to a content no snapshot references:
	// mark it deleted, its pack left in place.
	data := make([]byte, 100<<10)
	_, _ = rand.Read(data)
	var collected content.ID
	err := repo.DirectWriteSession(ctx, b.owner, repo.WriteSessionOptions{Purpose: "test"}, func(ctx context.Context, w repo.DirectRepositoryWriter) error {
		ow := w.NewObjectWriter(ctx, object.WriterOptions{})
		defer ow.Close()
		if _, err := ow.Write(data); err != nil {
			return err
		}
		oid, err := ow.Result()
		if err != nil {
			return err
		}
		var ok bool
		if collected, _, ok = oid.ContentID(); !ok {
			t.Fatalf("%s is not one content", oid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = repo.DirectWriteSession(ctx, b.owner, repo.WriteSessionOptions{Purpose: "test"}, func(ctx context.Context, w repo.DirectRepositoryWriter) error {
		return w.ContentManager().DeleteContent(ctx, collected)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.owner.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	ci, err := b.owner.ContentReader().ContentInfo(ctx, collected)
	if err != nil || !ci.Deleted {
		t.Fatalf("the collected content: %+v %v", ci, err)
	}
	// Kopia stamps a deletion at least a second after the write it
	// deletes, so the collection's stamp can lie ahead of the clock. A
	// drop stamped before it leaves it out of the watermark's reach, and
	// nothing waits (so this spec failed on a fast machine, one time in a
	// few): the loss is found once the clock has passed the collection,
	// as a collection that ran before a loss is in a cluster.
	for time.Now().Unix() <= ci.TimestampSeconds {
		time.Sleep(50 * time.Millisecond)
	}

	packs := b.dataPacks("web", "team-a", lost)
	for _, p := range packs {
		if err := b.storage.DeleteBlob(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	s := b.pass()
	if s.LostContents == 0 || s.Pending != s.LostContents {
		t.Fatalf("lost %d, pending %d: the lost contents should wait while a recently collected content is in the way", s.LostContents, s.Pending)
	}
	if ci, err := b.owner.ContentReader().ContentInfo(ctx, collected); err != nil || !ci.Deleted {
		t.Fatalf("the collected content was dropped from the index: %+v %v", ci, err)
	}
	if r := b.reports.take(); len(r) != 1 || !strings.Contains(r[0], "wait") {
		t.Fatalf("reports: %q", r)
	}

	// Once its pack is gone, there is nothing left to undelete.
	if err := b.storage.DeleteBlob(ctx, ci.PackBlobID); err != nil {
		t.Fatal(err)
	}
	if s := b.pass(); s.Pending != 0 {
		t.Fatalf("pending %d after the collected content's pack went", s.Pending)
	}
	b.kopia(b.web, "snapshot", "create", "--force-hash=100", lost)
	if ok, out := b.verifies(b.web, lost); !ok {
		t.Fatalf("after the lost contents were forgotten and the files read again:\n%s", out)
	}
}

// flakyServer is a Kopia server whose refresh fails a given number of
// times first, as a control API that times out under load does.
type flakyServer struct {
	srv   *testbed.KopiaServer
	fails int
	calls int
}

func (f *flakyServer) Refresh(ctx context.Context) error {
	f.calls++
	if f.fails > 0 {
		f.fails--
		return errors.New("control API: context deadline exceeded")
	}
	return f.srv.Refresh(ctx)
}

// TestALossIsReportedThoughTheServerDidNotRefresh: a pass that dropped
// lost contents reports them even when the refresh of the Kopia server
// that follows fails, and the next pass refreshes it. A pass that failed
// there used to leave the loss unreported for good: the next one finds
// nothing new in the index.
func TestALossIsReportedThoughTheServerDidNotRefresh(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	server := &flakyServer{srv: b.srv, fails: 1}
	b.verifier = integrity.NewVerifier(integrity.Options{
		Repository: b.owner, Reader: b.uncached, ReadBytesPerPass: 1 << 30,
		Server: server, Reports: b.reports, Log: testr.New(t),
	})
	lost := files(t, 2, 1<<20)
	b.kopia(b.web, "snapshot", "create", lost)
	b.pass()
	for _, p := range b.dataPacks("web", "team-a", lost) {
		if err := b.storage.DeleteBlob(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if s := b.pass(); s.LostContents == 0 || s.Error != "" {
		t.Fatalf("the pass that found the loss: %+v", s)
	}
	if r := b.reports.take(); len(r) != 1 || !strings.HasPrefix(r[0], "Warning RepositoryDamaged: ") {
		t.Fatalf("reports: %q", r)
	}
	calls := server.calls
	b.pass()
	if server.calls != calls+1 {
		t.Fatalf("the next pass did not refresh the server (%d calls, then %d)", calls, server.calls)
	}
	b.kopia(b.web, "snapshot", "create", "--force-hash=100", lost)
	if ok, out := b.verifies(b.web, lost); !ok {
		t.Fatalf("after the server was refreshed and the files read again:\n%s", out)
	}
}

// TestDamageCountsToTheWriterOfTheSnapshot: Kopia's access rules check a
// snapshot manifest's labels, not the source its payload names, so a guest
// may save manifests under its own labels that name another VM's source.
// Damage to them is that guest's own: its Events, its rehash notices, and
// a settled rewrite, never another VM's.
func TestDamageCountsToTheWriterOfTheSnapshot(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	rotten := files(t, 2, 1<<20)
	b.kopia(b.web, "snapshot", "create", rotten)

	// What web's guest may write through the server: a copy of its
	// manifest, under its own labels, whose payload names db.
	r, err := testbed.OpenKopiaSession(ctx, t, b.srv.URL, b.srv.CAPin, "web@team-a", b.passwords["web@team-a"])
	if err != nil {
		t.Fatal(err)
	}
	web := snapshot.SourceInfo{UserName: "web", Host: "team-a", Path: rotten}
	ids, err := snapshot.ListSnapshotManifests(ctx, r, &web, nil)
	if err != nil || len(ids) != 1 {
		t.Fatalf("web's snapshots: %v, %v", ids, err)
	}
	m, err := snapshot.LoadSnapshot(ctx, r, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	m.ID = ""
	m.Source = snapshot.SourceInfo{UserName: "db", Host: "team-a", Path: rotten}
	labels := map[string]string{manifest.TypeLabelKey: snapshot.ManifestType, snapshot.UsernameLabel: "web", snapshot.HostnameLabel: "team-a", snapshot.PathLabel: rotten}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "test spoof"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		_, err := w.PutManifest(ctx, labels, m)
		return err
	})
	if err != nil {
		t.Fatalf("web's guest could not save its manifest naming db: %v", err)
	}

	if err := testbed.RotBlob(ctx, b.storage, b.dataPacks("web", "team-a", rotten)[0]); err != nil {
		t.Fatal(err)
	}
	s := b.pass()
	if s.DamagedSnapshots != 2 || len(s.Damaged) != 1 || s.Damaged[0].User != "web" || s.Damaged[0].Snapshots != 2 {
		t.Fatalf("damaged %d snapshots: %+v; want web's two, and nothing of db's", s.DamagedSnapshots, s.Damaged)
	}
}
