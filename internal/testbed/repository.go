package testbed

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/kopia/kopia/snapshot/upload"
)

// RepositoryPassword is the password of NewRepository's repositories.
const RepositoryPassword = "repository password"

// NewRepository creates a filesystem Kopia repository in a temporary
// folder of tb and opens it in this process, as the server pod's user sync
// does, for unit tests of the code that writes it; tb's cleanup closes it.
func NewRepository(tb TB) repo.Repository {
	tb.Helper()
	ctx := context.Background()
	dir := tb.TempDir()
	st, err := filesystem.New(ctx, &filesystem.Options{Path: filepath.Join(dir, "repository")}, true)
	if err != nil {
		tb.Fatalf("create repository storage: %v", err)
	}
	if err := repo.Initialize(ctx, st, &repo.NewRepositoryOptions{}, RepositoryPassword); err != nil {
		tb.Fatalf("create repository: %v", err)
	}
	config := filepath.Join(dir, "repository.config")
	if err := repo.Connect(ctx, config, st, RepositoryPassword, &repo.ConnectOptions{}); err != nil {
		tb.Fatalf("connect to repository: %v", err)
	}
	r, err := repo.Open(ctx, config, RepositoryPassword, &repo.Options{})
	if err != nil {
		tb.Fatalf("open repository: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close(ctx) })
	return r
}

// SaveSnapshots uploads n snapshots of source into r, the i-th of the tree
// root(i), in one write session, as a benchmark sets a repository up: one
// session writes far fewer packs than a client's session per snapshot, and
// takes minutes less for thousands of snapshots. Each snapshot reads its
// whole tree (no previous snapshot to build on): its files' contents are
// deduplicated, not its entries.
func SaveSnapshots(ctx context.Context, r repo.Repository, source snapshot.SourceInfo, n int, root func(i int) fs.Entry) error {
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "test bed snapshots"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		tree, err := policy.TreeForSource(ctx, w, source)
		if err != nil {
			return err
		}
		for i := range n {
			man, err := upload.NewUploader(w).Upload(ctx, root(i), tree, source)
			if err != nil {
				return err
			}
			if _, err := snapshot.SaveSnapshot(ctx, w, man); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("save %d snapshots of %s: %w", n, source, err)
	}
	return nil
}
