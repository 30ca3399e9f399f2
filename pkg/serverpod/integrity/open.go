package integrity

import (
	"context"
	"fmt"
	"os"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/content"
)

// OpenUncached opens the repository configFile connects to through a
// copy of that configuration without a content cache (written beside it,
// at configFile + ".uncached"), for Options.Reader: a pass that reads a
// pack back must get its bytes from the storage, not from a cache an
// earlier read filled, or rot would go unseen.
func OpenUncached(ctx context.Context, configFile, password string) (repo.DirectRepository, error) {
	data, err := os.ReadFile(configFile)
	if err != nil {
		return nil, fmt.Errorf("read repository configuration: %w", err)
	}
	uncached := configFile + ".uncached"
	if err := os.WriteFile(uncached, data, 0o600); err != nil {
		return nil, fmt.Errorf("write the uncached repository configuration: %w", err)
	}
	// A content cache size of zero is Kopia's "no cache directory":
	// reads pass through to the storage.
	if err := repo.SetCachingOptions(ctx, uncached, &content.CachingOptions{}); err != nil {
		return nil, fmt.Errorf("turn the content cache off in %s: %w", uncached, err)
	}
	r, err := repo.Open(ctx, uncached, password, &repo.Options{})
	if err != nil {
		return nil, fmt.Errorf("open repository without a cache: %w", err)
	}
	dr, ok := r.(repo.DirectRepository)
	if !ok {
		_ = r.Close(ctx)
		return nil, fmt.Errorf("%s is not a direct repository connection", configFile)
	}
	return dr, nil
}
