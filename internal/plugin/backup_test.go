package plugin

import (
	"testing"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// TestBackupSpec holds backup's flags to the GuestSnapshot they ask for.
func TestBackupSpec(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    v1alpha1.GuestSnapshotSpec
		wantErr string
	}{
		{name: "the VM's own paths", args: nil, want: v1alpha1.GuestSnapshotSpec{VM: "web"}},
		{
			name: "paths, tags and a description",
			args: []string{"--path", "/etc", "--path", "/srv/data", "--tag", "reason=upgrade", "--tag", "ticket=", "--description", "before the upgrade"},
			want: v1alpha1.GuestSnapshotSpec{VM: "web", Paths: []string{"/etc", "/srv/data"}, Tags: map[string]string{"reason": "upgrade", "ticket": ""}, Description: "before the upgrade"},
		},
		{name: "a tag without a value", args: []string{"--tag", "reason"}, wantErr: `--tag "reason": want KEY=VALUE`},
		{name: "a tag without a key", args: []string{"--tag", "=upgrade"}, wantErr: `--tag "=upgrade": want KEY=VALUE`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o backupOptions
			parseFlags(t, o.addFlags, tt.args)
			got, err := o.spec("web")
			checkSpec(t, got, err, tt.want, tt.wantErr)
		})
	}
}
