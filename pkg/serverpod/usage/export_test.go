package usage

import (
	"context"

	"github.com/kopia/kopia/repo"
)

// Reads is how many directories and lists of indirect objects Measure
// reads for each user.
func Reads(ctx context.Context, r repo.DirectRepository) (map[string]int, error) {
	walks, err := measure(ctx, r)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for user, w := range walks {
		out[user] = w.reads
	}
	return out, nil
}
