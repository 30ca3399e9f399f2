package testbed

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSmallVolumeFillsUpAndFreesAgain(t *testing.T) {
	dir := SmallVolume(t, 4<<20)
	if free, err := FreeBytes(dir); err != nil || free < 3<<20 || free > 4<<20 {
		t.Fatalf("a fresh 4 MiB volume has %d bytes free (%v)", free, err)
	}
	ballast, err := FillVolume(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 64<<10)
	if err := os.WriteFile(filepath.Join(dir, "write"), data, 0o600); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("a write to a full volume: %v, want ENOSPC", err)
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "write"), data, 0o600); err != nil {
		t.Fatalf("a write once the ballast is gone: %v", err)
	}
}
