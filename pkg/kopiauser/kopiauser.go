// Package kopiauser reads and writes the user profiles a Kopia repository
// server authenticates guests against, and the access rules (ACLs) that say
// what each may do. It runs in the server pod, which alone opens the
// repository.
//
// Users live in the repository as manifests in identity's profile format,
// so any server opened on the same storage serves the same guests. Kopia
// keeps this format in an internal package, so it is written here through
// Kopia's public repository API.
package kopiauser

import (
	"context"
	"fmt"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

// Put creates or replaces the profile of username.
func Put(ctx context.Context, w repo.RepositoryWriter, username string, h identity.Hash) error {
	return put(ctx, w, username, h, true)
}

// put writes the profile of username; replace also removes older profiles of
// the user, which a user known to be new does not need (and a lookup per
// user would make adding many users quadratic).
func put(ctx context.Context, w repo.RepositoryWriter, username string, h identity.Hash, replace bool) error {
	p, err := identity.NewProfile(username, h)
	if err != nil {
		return err
	}
	if replace {
		_, err = w.ReplaceManifests(ctx, identity.ProfileLabels(username), p)
	} else {
		_, err = w.PutManifest(ctx, identity.ProfileLabels(username), p)
	}
	if err != nil {
		return fmt.Errorf("write profile of %s: %w", username, err)
	}
	return nil
}

// Delete removes every profile of username; deleting a missing user is not an error.
func Delete(ctx context.Context, w repo.RepositoryWriter, username string) error {
	entries, err := w.FindManifests(ctx, identity.ProfileLabels(username))
	if err != nil {
		return fmt.Errorf("find profile of %s: %w", username, err)
	}
	for _, e := range entries {
		if err := w.DeleteManifest(ctx, e.ID); err != nil {
			return fmt.Errorf("delete profile of %s: %w", username, err)
		}
	}
	return nil
}

// List returns the password hash of every user in the repository.
func List(ctx context.Context, r repo.Repository) (map[string]identity.Hash, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: identity.ManifestType})
	if err != nil {
		return nil, fmt.Errorf("list user profiles: %w", err)
	}
	users := make(map[string]identity.Hash, len(entries))
	for _, e := range manifest.DedupeEntryMetadataByLabel(entries, identity.LabelUsername) {
		var p identity.Profile
		if _, err := r.GetManifest(ctx, e.ID, &p); err != nil {
			return nil, fmt.Errorf("read profile of %s: %w", e.Labels[identity.LabelUsername], err)
		}
		users[e.Labels[identity.LabelUsername]] = p.Hash()
	}
	return users, nil
}
