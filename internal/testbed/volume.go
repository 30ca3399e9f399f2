package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// SmallVolume returns a folder that is a filesystem of its own, of size
// bytes: a small PersistentVolume that fills up as a real one does, with
// "no space left on device" for every write past its end. It is a tmpfs
// (the test bed runs as root, as a kubelet does); tb's cleanup unmounts it.
func SmallVolume(tb TB, size int64) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "volume")
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatalf("small volume: %v", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.FormatInt(size, 10)+",mode=0700"); err != nil {
		tb.Fatalf("small volume: mount a tmpfs of %d bytes on %s: %v", size, dir, err)
	}
	tb.Cleanup(func() {
		// Lazily: a process the spec started may still hold a file there
		// while its own cleanup runs.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Logf("small volume %s not unmounted: %v", dir, err)
		}
	})
	return dir
}

// FreeBytes is what a filesystem has left for an unprivileged writer, as
// df's Available says.
func FreeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil //nolint:gosec // block counts of a test volume
}

// FillVolume takes the space of the filesystem that holds dir with a
// ballast file until no more than leave bytes are free, as another writer
// of the same volume would, and returns the ballast's path: removing it
// gives the space back.
func FillVolume(dir string, leave int64) (string, error) {
	free, err := FreeBytes(dir)
	if err != nil {
		return "", err
	}
	ballast := filepath.Join(dir, "ballast")
	f, err := os.OpenFile(ballast, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("fill %s: %w", dir, err)
	}
	defer f.Close()
	if free > leave {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, free-leave); err != nil && !errors.Is(err, unix.ENOSPC) {
			return "", fmt.Errorf("fill %s with %d bytes: %w", dir, free-leave, err)
		}
	}
	return ballast, nil
}
