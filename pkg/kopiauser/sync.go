package kopiauser

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kopia/kopia/repo"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

// Op is what a Change does to one user.
type Op string

const (
	// OpAdd creates a user the repository does not have.
	OpAdd Op = "add"
	// OpUpdate replaces the password hash of an existing user.
	OpUpdate Op = "update"
	// OpDelete removes a user that is no longer desired.
	OpDelete Op = "delete"
)

// Change is one step from the repository's users towards the desired ones.
type Change struct {
	Op       Op
	Username string
	// Hash is the desired hash; empty for OpDelete.
	Hash identity.Hash
}

// Plan returns the changes that turn actual into desired, sorted by user
// name so that a plan is reproducible. Hashes are compared as stored: a
// password is never re-hashed to find out whether it changed, so callers keep
// each user's hash and hand the same one over on every resync.
func Plan(desired, actual map[string]identity.Hash) []Change {
	var changes []Change
	for name, want := range desired {
		have, ok := actual[name]
		switch {
		case !ok:
			changes = append(changes, Change{Op: OpAdd, Username: name, Hash: want})
		case !have.Equal(want):
			changes = append(changes, Change{Op: OpUpdate, Username: name, Hash: want})
		}
	}
	for name := range actual {
		if _, ok := desired[name]; !ok {
			changes = append(changes, Change{Op: OpDelete, Username: name})
		}
	}
	slices.SortFunc(changes, func(a, b Change) int { return strings.Compare(a.Username, b.Username) })
	return changes
}

// Apply writes changes to the repository. Callers run it inside one
// repo.WriteSession, so that a plan lands as a whole or not at all.
func Apply(ctx context.Context, w repo.RepositoryWriter, changes []Change) error {
	for _, c := range changes {
		var err error
		switch c.Op {
		case OpAdd:
			err = put(ctx, w, c.Username, c.Hash, false)
		case OpUpdate:
			err = Put(ctx, w, c.Username, c.Hash)
		case OpDelete:
			err = Delete(ctx, w, c.Username)
		default:
			err = fmt.Errorf("unknown operation %q", c.Op)
		}
		if err != nil {
			return fmt.Errorf("%s user %s: %w", c.Op, c.Username, err)
		}
	}
	return nil
}

// Sync makes the repository's users exactly desired, in one write session,
// and returns what it changed.
func Sync(ctx context.Context, r repo.Repository, desired map[string]identity.Hash) ([]Change, error) {
	actual, err := List(ctx, r)
	if err != nil {
		return nil, err
	}
	changes := Plan(desired, actual)
	if len(changes) == 0 {
		return nil, nil
	}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup user sync"},
		func(ctx context.Context, w repo.RepositoryWriter) error { return Apply(ctx, w, changes) })
	if err != nil {
		return nil, fmt.Errorf("sync users: %w", err)
	}
	return changes, nil
}
