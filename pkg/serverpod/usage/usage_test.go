package usage_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	kopiafs "github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/fs/virtualfs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/kopia/kopia/snapshot/upload"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/guestbackup/guestbackup/pkg/serverpod/usage"
)

// contents is a set of content IDs.
type contents map[content.ID]bool

// union is the contents of every set.
func union(sets ...contents) contents {
	out := contents{}
	for _, s := range sets {
		maps.Copy(out, s)
	}
	return out
}

// only is the contents of s whose ID has prefix ("" for file data, "k"
// for directories, "x" for the lists of indirect objects).
func (s contents) only(prefix content.IDPrefix) contents {
	out := contents{}
	for id := range s {
		if id.Prefix() == prefix {
			out[id] = true
		}
	}
	return out
}

// bed is a real Kopia repository on filesystem storage, opened without a
// content cache (so that a pack taken from the storage is gone for the
// reader too), and the snapshots written into it with the contents each
// added to the index.
type bed struct {
	t       *testing.T
	dir     string
	storage blob.Storage
	r       repo.DirectRepository
	ids     map[string]manifest.ID
	added   map[string]contents
}

func newBed(t testing.TB) (blob.Storage, repo.DirectRepository, string) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "repository")
	st, err := filesystem.New(ctx, &filesystem.Options{Path: dir}, true)
	if err != nil {
		t.Fatal(err)
	}
	const password = "test password"
	if err := repo.Initialize(ctx, st, &repo.NewRepositoryOptions{}, password); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "owner.config")
	if err := repo.Connect(ctx, config, st, password, &repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: "guestbackup-maintenance", Hostname: "main.backup"}}); err != nil {
		t.Fatal(err)
	}
	// A content cache size of zero is Kopia's "no cache directory".
	if err := repo.SetCachingOptions(ctx, config, &content.CachingOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(ctx) })
	return st, r.(repo.DirectRepository), dir
}

// index is every content of the index but the manifests', deleted or not.
func (b *bed) index() map[content.ID]content.Info {
	b.t.Helper()
	ctx := context.Background()
	if err := b.r.Refresh(ctx); err != nil {
		b.t.Fatal(err)
	}
	out := map[content.ID]content.Info{}
	err := b.r.ContentReader().IterateContents(ctx, content.IterateOptions{IncludeDeleted: true}, func(info content.Info) error {
		if info.ContentID.Prefix() != manifest.ContentPrefix {
			out[info.ContentID] = info
		}
		return nil
	})
	if err != nil {
		b.t.Fatal(err)
	}
	return out
}

// snap writes snapshot name of user@host:/data whose tree is root, and
// records the contents it added to the index. The tree is uploaded in a
// session of its own, before the one that saves the manifest, so that
// its directories' pack holds no manifest.
func (b *bed) snap(name, user string, root kopiafs.Entry, incomplete bool) {
	b.t.Helper()
	ctx := context.Background()
	u, host, _ := strings.Cut(user, "@")
	source := snapshot.SourceInfo{UserName: u, Host: host, Path: "/data"}
	before := b.index()
	var man *snapshot.Manifest
	err := repo.WriteSession(ctx, b.r, repo.WriteSessionOptions{Purpose: "test upload"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		tree, err := policy.TreeForSource(ctx, w, source)
		if err != nil {
			return err
		}
		man, err = upload.NewUploader(w).Upload(ctx, root, tree, source)
		return err
	})
	if err != nil {
		b.t.Fatal(err)
	}
	if incomplete {
		man.IncompleteReason = upload.IncompleteReasonCheckpoint
	}
	err = repo.WriteSession(ctx, b.r, repo.WriteSessionOptions{Purpose: "test manifest"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		b.ids[name], err = snapshot.SaveSnapshot(ctx, w, man)
		return err
	})
	if err != nil {
		b.t.Fatal(err)
	}
	added := contents{}
	for id := range b.index() {
		if _, ok := before[id]; !ok {
			added[id] = true
		}
	}
	b.added[name] = added
}

// forget deletes snapshot name's manifest; its contents stay in the index.
func (b *bed) forget(name string) {
	b.t.Helper()
	err := repo.WriteSession(context.Background(), b.r, repo.WriteSessionOptions{Purpose: "test delete"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		return w.DeleteManifest(ctx, b.ids[name])
	})
	if err != nil {
		b.t.Fatal(err)
	}
}

// dirPacks are the packs that hold snapshot name's directories.
func (b *bed) dirPacks(name string) []blob.ID {
	b.t.Helper()
	var packs []blob.ID
	for id := range b.added[name].only("k") {
		info, err := b.r.ContentInfo(context.Background(), id)
		if err != nil {
			b.t.Fatal(err)
		}
		if !slices.Contains(packs, info.PackBlobID) {
			packs = append(packs, info.PackBlobID)
		}
	}
	if len(packs) == 0 {
		b.t.Fatalf("snapshot %s wrote no directory", name)
	}
	return packs
}

// packFile is the file the filesystem storage keeps pack p in: its ID
// split into shard folders, with the suffix ".f".
func (b *bed) packFile(p blob.ID) string {
	b.t.Helper()
	var found string
	err := filepath.WalkDir(b.dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(path, b.dir), ".f"), string(filepath.Separator), "") == string(p) {
			found = path
		}
		return err
	})
	if err != nil || found == "" {
		b.t.Fatalf("pack %s is not in %s: %v", p, b.dir, err)
	}
	return found
}

// packed is the packed size the index gives the contents of s, deleted or
// not: the expected usage, found without the code under test.
func (b *bed) packed(s contents) int64 {
	b.t.Helper()
	var n int64
	for id := range s {
		info, err := b.r.ContentInfo(context.Background(), id)
		if err != nil {
			b.t.Fatalf("content %s: %v", id, err)
		}
		n += int64(info.PackedLength)
	}
	return n
}

func random(n int) []byte {
	data := make([]byte, n)
	_, _ = rand.Read(data)
	return data
}

// mtime is every file's: a directory of the same files is then the same
// directory object whenever it is written.
var mtime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func file(name string, data []byte) kopiafs.Entry {
	return virtualfs.StreamingFileWithModTimeFromReader(name, mtime, io.NopCloser(bytes.NewReader(data)))
}

func dir(name string, entries ...kopiafs.Entry) kopiafs.Directory {
	return virtualfs.NewStaticDirectory(name, entries)
}

// keptThenNew writes two snapshots of web@team-a: web0 of a file kept,
// web1 of the same file and a new one.
func keptThenNew(b *bed, kept []byte) {
	b.snap("web0", "web@team-a", dir("data", file("kept", kept)), false)
	b.snap("web1", "web@team-a", dir("data", file("kept", kept), file("new", random(32<<10))), false)
}

func TestMeasure(t *testing.T) {
	kept, shared := random(64<<10), random(96<<10)
	for _, tt := range []struct {
		name string
		// write writes the snapshots and does what else the case needs.
		write func(b *bed)
		// want is each user's expected contents.
		want func(b *bed) map[string]contents
		// reads, when set, is how many directories and lists of
		// indirect objects the walk reads for each user: each once.
		reads map[string]int
	}{{
		name: "two users, each its own contents",
		write: func(b *bed) {
			b.snap("web", "web@team-a", dir("data", file("a", random(100<<10)), dir("sub", file("b", random(10<<10)))), false)
			b.snap("db", "db@team-b", dir("data", file("c", random(50<<10))), false)
		},
		want: func(b *bed) map[string]contents {
			// Every content but the manifests' is one user's.
			if n := len(b.index()); n != len(b.added["web"])+len(b.added["db"]) {
				b.t.Fatalf("the index holds %d contents, the snapshots added %d and %d", n, len(b.added["web"]), len(b.added["db"]))
			}
			return map[string]contents{"web@team-a": b.added["web"], "db@team-b": b.added["db"]}
		},
	}, {
		name: "a file unchanged across snapshots counts once",
		write: func(b *bed) {
			for i := range 3 {
				// Ten directories the same in each snapshot.
				tree := dir("leaf", file("kept", kept))
				for j := range 9 {
					tree = dir(fmt.Sprint("d", j), tree)
				}
				b.snap(fmt.Sprint("db", i), "db@team-b", dir("data", file("kept", kept), file("fresh", random(4<<10)), tree), false)
			}
		},
		// Each snapshot's root, and the unchanged directories once.
		reads: map[string]int{"db@team-b": 3 + 10},
		want: func(b *bed) map[string]contents {
			// Only the first snapshot added the kept file's content: each
			// later one added its fresh file alone.
			if n0, n1, n2 := len(b.added["db0"].only("")), len(b.added["db1"].only("")), len(b.added["db2"].only("")); n0 != 2 || n1 != 1 || n2 != 1 {
				b.t.Fatalf("the snapshots added %d, %d and %d file contents, want 2, 1, 1", n0, n1, n2)
			}
			return map[string]contents{"db@team-b": union(b.added["db0"], b.added["db1"], b.added["db2"])}
		},
	}, {
		name: "a snapshot counts to the user its labels name, whatever source its payload claims",
		write: func(b *bed) {
			b.snap("web", "web@team-a", dir("data", file("a", random(40<<10))), false)
			// Web's guest saves a manifest under its own labels, which is
			// all Kopia's access rules check, naming db's source inside.
			ctx := context.Background()
			m, err := snapshot.LoadSnapshot(ctx, b.r, b.ids["web"])
			if err != nil {
				b.t.Fatal(err)
			}
			labels := map[string]string{manifest.TypeLabelKey: snapshot.ManifestType, snapshot.UsernameLabel: "web", snapshot.HostnameLabel: "team-a", snapshot.PathLabel: "/data"}
			m.ID = ""
			m.Source = snapshot.SourceInfo{UserName: "db", Host: "team-b", Path: "/data"}
			err = repo.WriteSession(ctx, b.r, repo.WriteSessionOptions{Purpose: "test spoof"}, func(ctx context.Context, w repo.RepositoryWriter) error {
				_, err := w.PutManifest(ctx, labels, m)
				return err
			})
			if err != nil {
				b.t.Fatal(err)
			}
		},
		want: func(b *bed) map[string]contents {
			return map[string]contents{"web@team-a": b.added["web"]}
		},
	}, {
		name: "a content two users share counts to each",
		write: func(b *bed) {
			// A third user writes the shared file first, so that its
			// content is known; its snapshot then goes.
			b.snap("seed", "seed@team-c", dir("data", file("shared", shared)), false)
			b.snap("web", "web@team-a", dir("data", file("shared", shared), file("a", random(8<<10))), false)
			b.snap("db", "db@team-b", dir("data", file("copy", shared), file("c", random(8<<10))), false)
			b.forget("seed")
		},
		want: func(b *bed) map[string]contents {
			s := b.added["seed"].only("")
			if len(s) != 1 {
				b.t.Fatalf("the shared file is %d contents, want 1", len(s))
			}
			return map[string]contents{"web@team-a": union(b.added["web"], s), "db@team-b": union(b.added["db"], s)}
		},
	}, {
		name: "deleting the latest snapshot lowers the usage to the earlier one's",
		write: func(b *bed) {
			keptThenNew(b, kept)
			b.forget("web1")
		},
		want: func(b *bed) map[string]contents {
			return map[string]contents{"web@team-a": b.added["web0"]}
		},
	}, {
		name: "deleting the earliest snapshot keeps what the later one references",
		write: func(b *bed) {
			keptThenNew(b, kept)
			b.forget("web0")
		},
		want: func(b *bed) map[string]contents {
			// The first snapshot's directory no longer counts, the kept
			// file it added does.
			return map[string]contents{"web@team-a": union(b.added["web1"], b.added["web0"].only(""))}
		},
	}, {
		name: "an incomplete snapshot counts",
		write: func(b *bed) {
			b.snap("web", "web@team-a", dir("data", file("a", random(20<<10))), true)
		},
		want: func(b *bed) map[string]contents {
			return map[string]contents{"web@team-a": b.added["web"]}
		},
	}, {
		name: "an indirect object counts its chunks and its list",
		write: func(b *bed) {
			b.snap("web", "web@team-a", dir("data", file("big", random(24<<20))), false)
		},
		want: func(b *bed) map[string]contents {
			if len(b.added["web"].only("x")) == 0 || len(b.added["web"].only("")) < 2 {
				b.t.Fatalf("the big file was written as %d chunks and %d lists, want an indirect object", len(b.added["web"].only("")), len(b.added["web"].only("x")))
			}
			return map[string]contents{"web@team-a": b.added["web"]}
		},
		reads: map[string]int{"web@team-a": 2},
	}, {
		name: "a directory listed many times and a deep tree count their contents once",
		write: func(b *bed) {
			var same []kopiafs.Entry
			for i := range 200 {
				same = append(same, dir(fmt.Sprint("copy", i), file("kept", kept)))
			}
			deep := dir("leaf", file("a", random(1<<10)))
			for i := range 300 {
				deep = dir(fmt.Sprint("d", i), deep)
			}
			b.snap("web", "web@team-a", dir("data", dir("same", same...), deep), false)
		},
		want: func(b *bed) map[string]contents {
			// 200 copies of one directory, 301 nested, two more: the
			// index holds the copies once.
			if n := len(b.added["web"].only("k")); n != 1+1+1+301 {
				b.t.Fatalf("the snapshot wrote %d directories, want %d", n, 304)
			}
			return map[string]contents{"web@team-a": b.added["web"]}
		},
		reads: map[string]int{"web@team-a": 304},
	}, {
		name: "contents the index marks deleted count while referenced",
		write: func(b *bed) {
			b.snap("web", "web@team-a", dir("data", file("a", random(20<<10)), dir("sub", file("b", random(20<<10)))), false)
			err := repo.DirectWriteSession(context.Background(), b.r, repo.WriteSessionOptions{Purpose: "test delete contents"}, func(ctx context.Context, w repo.DirectRepositoryWriter) error {
				for id := range b.added["web"] {
					if err := w.ContentManager().DeleteContent(ctx, id); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.t.Fatal(err)
			}
		},
		want: func(b *bed) map[string]contents {
			for id, info := range b.index() {
				if b.added["web"][id] && !info.Deleted {
					b.t.Fatalf("content %s is not marked deleted", id)
				}
			}
			return map[string]contents{"web@team-a": b.added["web"]}
		},
	}, {
		name: "a directory whose pack is gone counts its own contents only",
		write: func(b *bed) {
			b.snap("web", "web@team-a", dir("data", file("a", random(20<<10))), false)
			b.snap("db", "db@team-b", dir("data", file("c", random(20<<10))), false)
			for _, p := range b.dirPacks("web") {
				if err := b.storage.DeleteBlob(context.Background(), p); err != nil {
					b.t.Fatal(err)
				}
			}
		},
		want: func(b *bed) map[string]contents {
			return map[string]contents{"web@team-a": b.added["web"].only("k"), "db@team-b": b.added["db"]}
		},
	}, {
		name: "a directory whose pack does not decrypt counts its own contents only",
		write: func(b *bed) {
			b.snap("web", "web@team-a", dir("data", file("a", random(20<<10))), false)
			b.snap("db", "db@team-b", dir("data", file("c", random(20<<10))), false)
			for _, p := range b.dirPacks("web") {
				path := b.packFile(p)
				info, err := os.Stat(path)
				if err != nil {
					b.t.Fatal(err)
				}
				if err := os.WriteFile(path, random(int(info.Size())), 0o600); err != nil {
					b.t.Fatal(err)
				}
			}
		},
		want: func(b *bed) map[string]contents {
			return map[string]contents{"web@team-a": b.added["web"].only("k"), "db@team-b": b.added["db"]}
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			st, r, repoDir := newBed(t)
			b := &bed{t: t, dir: repoDir, storage: st, r: r, ids: map[string]manifest.ID{}, added: map[string]contents{}}
			tt.write(b)
			if err := r.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			got, err := usage.Measure(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]int64{}
			for user, s := range tt.want(b) {
				want[user] = b.packed(s)
			}
			t.Logf("usage %v", got)
			if !maps.Equal(got, want) {
				t.Errorf("usage %v, want %v", got, want)
			}
			if tt.reads == nil {
				return
			}
			reads, err := usage.Reads(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(reads, tt.reads) {
				t.Errorf("read %v objects, want %v", reads, tt.reads)
			}
		})
	}
}

// TestMeasureFailsWhenTheStorageDoesNotAnswer: a storage that no longer
// holds the repository fails the measurement instead of reporting every
// user's data as lost.
func TestMeasureFailsWhenTheStorageDoesNotAnswer(t *testing.T) {
	ctx := context.Background()
	st, r, repoDir := newBed(t)
	b := &bed{t: t, dir: repoDir, storage: st, r: r, ids: map[string]manifest.ID{}, added: map[string]contents{}}
	b.snap("web", "web@team-a", dir("data", file("a", random(20<<10))), false)
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	// The manifests are in memory once listed: only the walk meets the
	// storage that went.
	if _, err := snapshot.ListSnapshots(ctx, r, snapshot.SourceInfo{UserName: "web", Host: "team-a", Path: "/data"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(repoDir, repoDir+".gone"); err != nil {
		t.Fatal(err)
	}
	got, err := usage.Measure(ctx, r)
	t.Logf("error: %v", err)
	if err == nil {
		t.Fatalf("measured %v on a storage that no longer holds the repository, want an error", got)
	}

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := os.Rename(repoDir+".gone", repoDir); err != nil {
		t.Fatal(err)
	}
	if got, err := usage.Measure(canceled, r); err == nil {
		t.Fatalf("measured %v with a canceled context, want an error", got)
	}
}

func TestCollectorServesTheLastUsage(t *testing.T) {
	c := &usage.Collector{}
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Fatalf("an unset Collector serves %d metrics, want none (no figure is better than a false 0)", n)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	c.Set(map[string]int64{"web@team-a": 1 << 20, "db@team-b": 42})
	c.Set(map[string]int64{"web@team-a": 3 << 20})
	want := `# HELP guestbackup_server_user_stored_bytes Bytes the repository's storage holds for a guest's user: the packed size of the distinct contents its snapshots reference, deduplicated within the user and not across users, at the last measurement.
# TYPE guestbackup_server_user_stored_bytes gauge
guestbackup_server_user_stored_bytes{user="web@team-a"} 3.145728e+06
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
