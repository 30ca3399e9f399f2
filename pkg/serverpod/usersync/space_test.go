package usersync

import (
	"context"
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
	"k8s.io/client-go/kubernetes/fake"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
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

// A refusal stays, with its first words and time, until its writer's
// next attempt succeeds; a failure for another reason neither sets nor
// clears it; each writer's is its own. /metrics says so, and the space
// measured.
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
	if first != "user sync: "+full.Error() || at.IsZero() || metric() != 1 {
		t.Fatalf("refusal %q at %v, metric %v; want %q", first, at, metric(), full.Error())
	}
	s.noteWrite(fmt.Errorf("write manifest: %w", &fs.PathError{Op: "write", Path: "/r/tmp2", Err: syscall.ENOSPC}))
	s.noteWrite(errors.New("connection refused"))
	if again, atAgain := s.space.refusal(); again != first || !atAgain.Equal(at) {
		t.Errorf("a retry changed the refusal to %q at %v", again, atAgain)
	}

	// Maintenance, whose failure is text by the time it is published.
	publisher := maintenancePublisher{
		ConfigMapPublisher: maintenance.ConfigMapPublisher{ConfigMaps: fake.NewClientset().CoreV1().ConfigMaps("backup"), BSLS: "main"},
		space:              s.space,
	}
	publish := func(failure string) {
		t.Helper()
		// The ConfigMap does not exist: the outcome is noted all the same.
		_ = publisher.Publish(context.Background(), v1alpha1.MaintenanceStatus{Failure: failure})
	}
	publish("maintenance run: put blob: Bucket quota exceeded")
	if got := refused(); !strings.HasPrefix(got, "maintenance: maintenance run: put blob: Bucket quota exceeded; user sync: ") {
		t.Errorf("refusals %q, want maintenance's and user sync's", got)
	}
	s.noteWrite(nil)
	if got := refused(); got != "maintenance: maintenance run: put blob: Bucket quota exceeded" || metric() != 1 {
		t.Errorf("after user sync succeeded: refusals %q, want maintenance's only", got)
	}
	publish("repository maintenance is owned by someone else")
	if got := refused(); got != "maintenance: maintenance run: put blob: Bucket quota exceeded" {
		t.Errorf("a failure for another reason changed the refusal to %q", got)
	}
	publish("")
	if refused() != "" || metric() != 0 {
		t.Errorf("a successful run left the refusal %q", refused())
	}

	if n := testutil.CollectAndCount(s.space); n != 1 {
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
	if err := testutil.CollectAndCompare(s.space, strings.NewReader(want), "guestbackup_server_storage_free_bytes", "guestbackup_server_storage_capacity_bytes"); err != nil {
		t.Error(err)
	}
}

// A refusal on a measured volume ends once the volume gained 1% of its
// capacity since: maintenance tries again only at its next run, and must
// not keep a grown claim full in the admin's eyes until then. On storage
// that cannot tell, only the writer's next success ends it.
func TestRefusalEndsWhenTheVolumeGainsSpace(t *testing.T) {
	const capacity = 100 << 20
	sp := &spaceState{}
	sp.measure(&maintenancestate.StorageSpace{FreeBytes: 0, CapacityBytes: capacity})
	sp.note(writerMaintenance, "write index: no space left on device", true, time.Now())
	sp.measure(&maintenancestate.StorageSpace{FreeBytes: capacity/100 - 1, CapacityBytes: capacity})
	if r, _ := sp.refusal(); r == "" {
		t.Fatal("a refusal ended on less than 1% of the capacity freed")
	}
	sp.measure(&maintenancestate.StorageSpace{FreeBytes: capacity / 100, CapacityBytes: capacity})
	if r, _ := sp.refusal(); r != "" {
		t.Errorf("refusal %q stayed on a volume that gained 1%% of its capacity", r)
	}

	s3 := &spaceState{}
	s3.note(writerMaintenance, "PutObject: Bucket quota exceeded", true, time.Now())
	s3.measure(nil)
	if r, _ := s3.refusal(); r == "" {
		t.Error("a refusal on storage that cannot tell its space ended without a success")
	}
}
