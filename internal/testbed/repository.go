package testbed

import (
	"context"
	"path/filepath"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob/filesystem"
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
