package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/golden"
)

// TestRestoreSpec holds restore's arguments and flags to the GuestRestore
// they ask for, and to the combinations it refuses before asking.
func TestRestoreSpec(t *testing.T) {
	evening := metav1.NewTime(time.Date(2026, 12, 6, 18, 0, 0, 0, time.UTC))
	spec := func(edit func(*v1alpha1.GuestRestoreSpec)) v1alpha1.GuestRestoreSpec {
		s := v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/nginx"}}
		edit(&s)
		return s
	}
	tests := []struct {
		name    string
		args    []string
		want    v1alpha1.GuestRestoreSpec
		wantErr string
	}{
		{
			name: "the latest snapshot, into the restores folder",
			args: []string{"web", "/etc/nginx"},
			want: spec(func(*v1alpha1.GuestRestoreSpec) {}),
		},
		{
			name: "a VM named as kubectl names it, and several paths",
			args: []string{"vm/web", "/etc/nginx", "/srv/www"},
			want: spec(func(s *v1alpha1.GuestRestoreSpec) { s.Paths = []string{"/etc/nginx", "/srv/www"} }),
		},
		{
			name: "a snapshot by ID, in place",
			args: []string{"virtualmachine/web", "/etc/nginx", "--from", "k3c5a1e2f", "--in-place"},
			want: spec(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.ID = "k3c5a1e2f"; s.Target.InPlace = true }),
		},
		{
			name: "the last snapshot before a time, under a folder",
			args: []string{"web", "/etc/nginx", "--before", "2026-12-06T19:00:00+01:00", "--to", "/srv/restored"},
			want: spec(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.Before = &evening; s.Target.Directory = "/srv/restored" }),
		},
		{
			name: "another VM's snapshots, into an existing claim",
			args: []string{"new", "/etc/nginx", "--source-vm", "old", "--pvc", "data"},
			want: v1alpha1.GuestRestoreSpec{VM: "new", SourceVM: "old", Paths: []string{"/etc/nginx"},
				Target: v1alpha1.RestoreTarget{PersistentVolumeClaim: &v1alpha1.RestoreClaim{ClaimName: "data"}}},
		},
		{
			name: "into a new claim of a storage class",
			args: []string{"web", "/etc/nginx", "--pvc-size", "20Gi", "--storage-class", "fast"},
			want: spec(func(s *v1alpha1.GuestRestoreSpec) {
				s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: ptr.To(resource.MustParse("20Gi")), StorageClassName: ptr.To("fast")}
			}),
		},
		{
			name: "a listing, writing nothing",
			args: []string{"web", "/etc/nginx", "--list"},
			want: spec(func(s *v1alpha1.GuestRestoreSpec) { s.DryRun = true }),
		},
		{
			name:    "two ways to choose the snapshot",
			args:    []string{"web", "/etc/nginx", "--from", "k3c5a1e2f", "--before", "2026-12-06T18:00:00Z"},
			wantErr: "--from and --before both choose the snapshot: give one, or neither for the latest",
		},
		{
			name:    "a time without its zone",
			args:    []string{"web", "/etc/nginx", "--before", "2026-12-06 18:00"},
			wantErr: `--before "2026-12-06 18:00" is not a time: give one in RFC 3339, such as 2026-12-06T18:00:00Z`,
		},
		{
			name:    "a folder and in place",
			args:    []string{"web", "/etc/nginx", "--to", "/srv/restored", "--in-place"},
			wantErr: "--to, --in-place and --pvc/--pvc-size each choose where to restore: give at most one (none restores into /var/lib/guestbackup/restores/<request name> in the guest)",
		},
		{
			name:    "in place and a new claim",
			args:    []string{"web", "/etc/nginx", "--in-place", "--pvc-size", "1Gi"},
			wantErr: "each choose where to restore: give at most one",
		},
		{
			name:    "a claim both named and sized",
			args:    []string{"web", "/etc/nginx", "--pvc", "data", "--pvc-size", "1Gi"},
			wantErr: "--pvc names an existing claim and --pvc-size creates one named after the request: give one of them",
		},
		{
			name:    "a storage class for an existing claim",
			args:    []string{"web", "/etc/nginx", "--pvc", "data", "--storage-class", "fast"},
			wantErr: "--storage-class applies only to a claim --pvc-size creates",
		},
		{
			name:    "a size that is none",
			args:    []string{"web", "/etc/nginx", "--pvc-size", "big"},
			wantErr: `--pvc-size "big" is not a size: give one such as 20Gi`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o restoreOptions
			fs := parseFlags(t, o.addFlags, tt.args)
			vm, err := vmName(fs.Arg(0))
			if err != nil {
				t.Fatal(err)
			}
			got, err := o.spec(vm, fs.Args()[1:])
			checkSpec(t, got, err, tt.want, tt.wantErr)
		})
	}
}

// TestRestoreOutput renders, for each case under testdata/restore, what
// restore says of its restore.yaml: on standard error, once created and at
// its last change; on standard output, its outcome.
func TestRestoreOutput(t *testing.T) {
	dir := filepath.Join("testdata", "restore")
	for _, name := range golden.Cases(t, dir) {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, name, "restore.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			g := &v1alpha1.GuestRestore{}
			if err := yaml.UnmarshalStrict(data, g); err != nil {
				t.Fatal(err)
			}
			r := restoreRequest{g}
			var outcome strings.Builder
			r.printOutcome(&outcome)
			golden.Check(t, filepath.Join(dir, name), map[string][]byte{
				"stderr.txt": []byte(resourceOf(r) + "/" + g.Name + " created: " + r.next() + "\n" + stateLine(r) + "\n"),
				"stdout.txt": []byte(outcome.String()),
			}, "restore.yaml")
		})
	}
}

// TestHistorySpec holds history's arguments and flags to the GuestRestore
// they ask for: a dry run of one path's versions, which waits for them.
func TestHistorySpec(t *testing.T) {
	evening := metav1.NewTime(time.Date(2026, 12, 6, 18, 0, 0, 0, time.UTC))
	tests := []struct {
		name     string
		args     []string
		want     v1alpha1.GuestRestoreSpec
		wantWait bool
		wantErr  string
	}{
		{
			name: "a file's versions in all snapshots, waited for",
			args: []string{"vm/web", "/etc/nginx/nginx.conf"},
			want: v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/nginx/nginx.conf"}, DryRun: true, History: true}, wantWait: true,
		},
		{
			name: "another VM's, before a time, only created",
			args: []string{"new", "/srv/data", "--source-vm", "old", "--before", "2026-12-06T19:00:00+01:00", "--wait=false"},
			want: v1alpha1.GuestRestoreSpec{VM: "new", SourceVM: "old", Paths: []string{"/srv/data"}, DryRun: true, History: true,
				Snapshot: v1alpha1.SnapshotSelector{Before: &evening}},
		},
		{
			name:    "a time without its zone",
			args:    []string{"web", "/etc/hosts", "--before", "yesterday"},
			wantErr: `--before "yesterday" is not a time: give one in RFC 3339`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o historyOptions
			fs := parseFlags(t, o.addFlags, tt.args)
			vm, err := vmName(fs.Arg(0))
			if err != nil {
				t.Fatal(err)
			}
			got, err := o.spec(vm, fs.Arg(1))
			checkSpec(t, got, err, tt.want, tt.wantErr)
			if tt.wantErr == "" && o.wait != tt.wantWait {
				t.Errorf("wait %t, want %t", o.wait, tt.wantWait)
			}
		})
	}
}
