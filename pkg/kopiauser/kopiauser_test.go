package kopiauser

import (
	"testing"

	"github.com/kopia/kopia/repo/manifest"

	"github.com/guestbackup/guestbackup/pkg/identity"
)

// TestProfileLabelsAreKopias holds identity, which may not import Kopia, to
// the label Kopia finds manifests by.
func TestProfileLabelsAreKopias(t *testing.T) {
	if identity.TypeLabel != manifest.TypeLabelKey {
		t.Fatalf("identity.TypeLabel = %q, Kopia's type label is %q", identity.TypeLabel, manifest.TypeLabelKey)
	}
}
