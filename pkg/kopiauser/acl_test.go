package kopiauser

import (
	"context"
	"testing"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"

	"github.com/guestbackup/guestbackup/internal/kopiatest"
)

// acls returns every ACL manifest in the repository, keyed, and whether
// guestbackup wrote it.
func acls(t *testing.T, r repo.Repository) map[string]bool {
	t.Helper()
	entries, err := r.FindManifests(context.Background(), map[string]string{manifest.TypeLabelKey: aclManifestType})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		var a ACL
		if _, err := r.GetManifest(context.Background(), e.ID, &a); err != nil {
			t.Fatal(err)
		}
		out[a.key()] = e.Labels[LabelManagedACL] == "true"
	}
	return out
}

func TestSyncACLs(t *testing.T) {
	ctx := context.Background()
	r := kopiatest.NewRepository(t)
	admin := ACL{User: "auditor@ops", Target: map[string]string{manifest.TypeLabelKey: "snapshot"}, Access: AccessRead}
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		_, err := w.PutManifest(ctx, map[string]string{manifest.TypeLabelKey: aclManifestType}, admin)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	changed, err := SyncACLs(ctx, r, AppendOnlyACLs())
	if err != nil || !changed {
		t.Fatalf("first sync: changed %v, error %v", changed, err)
	}
	got := acls(t, r)
	if len(got) != len(AppendOnlyACLs())+1 || got[admin.key()] {
		t.Fatalf("after the first sync: %v", got)
	}
	for _, a := range AppendOnlyACLs() {
		if !got[a.key()] {
			t.Errorf("missing managed ACL %s", a.key())
		}
	}

	if changed, err := SyncACLs(ctx, r, AppendOnlyACLs()); err != nil || changed {
		t.Errorf("a resync in step: changed %v, error %v; want nothing to do", changed, err)
	}

	if changed, err := SyncACLs(ctx, r, nil); err != nil || !changed {
		t.Fatalf("turning append-only off: changed %v, error %v", changed, err)
	}
	if got := acls(t, r); len(got) != 1 || got[admin.key()] {
		t.Errorf("after turning append-only off, want only the admin's own ACL: %v", got)
	}
}
