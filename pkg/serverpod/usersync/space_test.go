package usersync

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

func TestSpaceMoved(t *testing.T) {
	const mib = 1 << 20
	space := func(free uint64) *maintenancestate.StorageSpace {
		return &maintenancestate.StorageSpace{FreeBytes: free, CapacityBytes: 100 * mib}
	}
	for _, tc := range []struct {
		name           string
		published, now *maintenancestate.StorageSpace
		want           bool
	}{
		{"never measured", nil, nil, false},
		{"measured for the first time", nil, space(50 * mib), true},
		{"no longer measured", space(50 * mib), nil, true},
		{"unchanged", space(50 * mib), space(50 * mib), false},
		{"moved by less than 1% of capacity", space(50 * mib), space(50*mib - mib/2), false},
		{"moved down by 1% of capacity", space(50 * mib), space(49 * mib), true},
		{"moved up by 1% of capacity", space(49 * mib), space(50 * mib), true},
		{"full", space(mib / 2), space(0), true},
		{"full no longer", space(0), space(4096), true},
		{"grown", space(mib), &maintenancestate.StorageSpace{FreeBytes: mib, CapacityBytes: 200 * mib}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := spaceMoved(tc.published, tc.now); got != tc.want {
				t.Errorf("spaceMoved(%+v, %+v) = %v, want %v", tc.published, tc.now, got, tc.want)
			}
		})
	}
}

// A refusal stays, with its first words and time, until a sync succeeds;
// a failure for another reason neither sets nor clears it. /metrics says
// so, and the space measured.
func TestNoteWrite(t *testing.T) {
	s := New(Options{})
	refused := func() string { r, _ := s.space.refusal(); return r }
	metric := func() float64 {
		t.Helper()
		var m dto.Metric
		ch := make(chan prometheus.Metric, 3)
		s.space.Collect(ch)
		close(ch)
		for x := range ch {
			if x.Desc() == storageRefusedDesc {
				if err := x.Write(&m); err != nil {
					t.Fatal(err)
				}
			}
		}
		return m.GetGauge().GetValue()
	}

	s.noteWrite(errors.New("connection refused"))
	if refused() != "" || metric() != 0 {
		t.Fatalf("a failure that is not for want of space recorded a refusal: %q", refused())
	}
	full := fmt.Errorf("write manifest: %w", &fs.PathError{Op: "write", Path: "/r/tmp1", Err: syscall.ENOSPC})
	s.noteWrite(full)
	first, at := s.space.refusal()
	if first != full.Error() || at.IsZero() || metric() != 1 {
		t.Fatalf("refusal %q at %v, metric %v; want %q", first, at, metric(), full.Error())
	}
	time.Sleep(time.Millisecond)
	s.noteWrite(fmt.Errorf("write manifest: %w", &fs.PathError{Op: "write", Path: "/r/tmp2", Err: syscall.ENOSPC}))
	s.noteWrite(errors.New("connection refused"))
	if again, atAgain := s.space.refusal(); again != first || !atAgain.Equal(at) {
		t.Errorf("a retry changed the refusal to %q at %v", again, atAgain)
	}
	s.noteWrite(nil)
	if refused() != "" || metric() != 0 {
		t.Errorf("a successful sync left the refusal %q", refused())
	}

	if n := testutil.CollectAndCount(&s.space); n != 1 {
		t.Errorf("unmeasured storage exports %d series, want only the refusal's", n)
	}
	s.space.measure(&maintenancestate.StorageSpace{FreeBytes: 3 << 20, CapacityBytes: 64 << 20})
	want := `# HELP guestbackup_server_storage_capacity_bytes Size in bytes of the repository's filesystem storage at the server pod's last storage check; absent where the storage cannot tell (S3).
# TYPE guestbackup_server_storage_capacity_bytes gauge
guestbackup_server_storage_capacity_bytes 6.7108864e+07
# HELP guestbackup_server_storage_free_bytes Bytes the repository's filesystem storage (its PersistentVolume) had free for Kopia at the server pod's last storage check; absent where the storage cannot tell (S3).
# TYPE guestbackup_server_storage_free_bytes gauge
guestbackup_server_storage_free_bytes 3.145728e+06
`
	if err := testutil.CollectAndCompare(&s.space, strings.NewReader(want), "guestbackup_server_storage_free_bytes", "guestbackup_server_storage_capacity_bytes"); err != nil {
		t.Error(err)
	}
}
