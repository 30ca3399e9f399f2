package readkeeper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"golang.org/x/sys/unix"
)

// ReserveName is the reserve's file in a filesystem repository's folder.
// Kopia's filesystem storage takes only files named "*.f" for blobs, so it
// never lists it.
const ReserveName = ".guestbackup-reserve"

// minReserve is the reserve's margin over what a compaction writes:
// filesystem blocks, the index blob, the session marker.
const minReserve = 1 << 20

// ReserveSize is what the reserve holds for manifest contents of
// manifestBytes packed bytes: a compaction writes them again as one content
// (no larger than their sum) in one pack blob, through a temporary file that
// it renames; twice that, and minReserve.
func ReserveSize(manifestBytes int64) int64 { return 2*manifestBytes + minReserve }

// reserve is space a Keeper holds on a filesystem storage's volume, taken
// while the volume has it and given back only to a compaction that failed
// without it. Any writer of the volume may take what it gives back: it is
// released for the moment of one compaction only.
type reserve struct {
	path string
}

// reserveOf is r's reserve when r is a filesystem repository, else nil:
// other storages (S3 and its kind) have no volume to hold space on.
func reserveOf(r repo.DirectRepository) *reserve {
	opts, ok := r.BlobReader().ConnectionInfo().Config.(*filesystem.Options)
	if !ok || opts.Path == "" {
		return nil
	}
	return &reserve{path: filepath.Join(opts.Path, ReserveName)}
}

// hold makes the reserve at least size bytes, allocated (not sparse), as
// far as the volume has them: on a full volume it holds what it has and
// reports the shortfall.
func (v *reserve) hold(size int64) error {
	f, err := os.OpenFile(v.path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("reserve %s: %w", v.path, err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("reserve %d bytes in %s: %w", size, v.path, err)
	}
	return nil
}

// held is the bytes the reserve holds.
func (v *reserve) held() (int64, error) {
	st, err := os.Stat(v.path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reserve %s: %w", v.path, err)
	}
	return st.Size(), nil
}

// release gives the reserve's space back to the volume.
func (v *reserve) release() error {
	if err := os.Truncate(v.path, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release reserve %s: %w", v.path, err)
	}
	return nil
}
