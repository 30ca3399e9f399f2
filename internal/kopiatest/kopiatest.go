// Package kopiatest gives unit tests a real Kopia repository, opened in
// process. It imports nothing of guestbackup, so the packages that
// internal/testbed itself builds on (kopiauser, activity) can use it in
// their own tests.
package kopiatest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob/filesystem"
)

// Password is the repositories' password.
const Password = "repository password"

// NewRepository creates a filesystem Kopia repository in a temporary
// folder of tb and opens it, as the server pod's user sync does; tb's
// cleanup closes it.
func NewRepository(tb testing.TB) repo.Repository {
	tb.Helper()
	ctx := context.Background()
	dir := tb.TempDir()
	st, err := filesystem.New(ctx, &filesystem.Options{Path: filepath.Join(dir, "repository")}, true)
	if err != nil {
		tb.Fatal(err)
	}
	if err := repo.Initialize(ctx, st, &repo.NewRepositoryOptions{}, Password); err != nil {
		tb.Fatal(err)
	}
	config := filepath.Join(dir, "repository.config")
	if err := repo.Connect(ctx, config, st, Password, &repo.ConnectOptions{}); err != nil {
		tb.Fatal(err)
	}
	r, err := repo.Open(ctx, config, Password, &repo.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = r.Close(ctx) })
	return r
}
