package integrity

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"

	"github.com/guestbackup/guestbackup/pkg/rehash"
)

// healing is, by guest (user@host), the rehash notice it needs: the
// sources whose next snapshot would build on a damaged one.
func (d *damage) healing() map[string]rehash.Notice {
	want := map[string]rehash.Notice{}
	if d == nil {
		return want
	}
	for _, s := range d.sources {
		if !s.healing {
			continue
		}
		key := s.src.UserName + "@" + s.src.Host
		n := want[key]
		n.Paths = append(n.Paths, s.src.Path)
		want[key] = n
	}
	for key, n := range want {
		slices.Sort(n.Paths)
		n.Reason = "the storage lost data that the latest snapshots of these paths reference; read every file again at the next snapshot (--force-hash=100), so that it is uploaded again"
		want[key] = n
	}
	return want
}

// noticeLabels are the labels of the notice of user@host.
func noticeLabels(userAtHost string) map[string]string {
	user, host, _ := strings.Cut(userAtHost, "@")
	return map[string]string{manifest.TypeLabelKey: rehash.ManifestType, rehash.LabelUsername: user, rehash.LabelHostname: host}
}

// syncNotices makes the repository's rehash notices exactly want, and
// says whether it changed any.
func syncNotices(ctx context.Context, dr repo.DirectRepository, want map[string]rehash.Notice) (bool, error) {
	existing, err := dr.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: rehash.ManifestType})
	if err != nil {
		return false, fmt.Errorf("list rehash notices: %w", err)
	}
	var stale []manifest.ID
	have := map[string]bool{}
	for _, m := range existing {
		key := m.Labels[rehash.LabelUsername] + "@" + m.Labels[rehash.LabelHostname]
		w, wanted := want[key]
		if !wanted || have[key] {
			stale = append(stale, m.ID)
			continue
		}
		var n rehash.Notice
		if _, err := dr.GetManifest(ctx, m.ID, &n); err != nil || !slices.Equal(n.Paths, w.Paths) {
			stale = append(stale, m.ID)
			continue
		}
		have[key] = true
	}
	var missing []string
	for key := range want {
		if !have[key] {
			missing = append(missing, key)
		}
	}
	if len(stale) == 0 && len(missing) == 0 {
		return false, nil
	}
	slices.Sort(missing)
	err = repo.WriteSession(ctx, dr, repo.WriteSessionOptions{Purpose: "guestbackup integrity: rehash notices"},
		func(ctx context.Context, w repo.RepositoryWriter) error {
			for _, id := range stale {
				if err := w.DeleteManifest(ctx, id); err != nil {
					return fmt.Errorf("delete rehash notice %s: %w", id, err)
				}
			}
			for _, key := range missing {
				if _, err := w.PutManifest(ctx, noticeLabels(key), want[key]); err != nil {
					return fmt.Errorf("write the rehash notice of %s: %w", key, err)
				}
			}
			return nil
		})
	if err != nil {
		return false, err
	}
	return true, nil
}
