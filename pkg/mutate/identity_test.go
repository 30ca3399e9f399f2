package mutate

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestParseServerRef(t *testing.T) {
	tests := []struct {
		value   string
		want    types.NamespacedName
		wantErr string
	}{
		{value: "backup/default", want: types.NamespacedName{Namespace: "backup", Name: "default"}},
		{value: "backup/server.v2", want: types.NamespacedName{Namespace: "backup", Name: "server.v2"}},
		{value: "default", wantErr: "want <namespace>/<name>"},
		{value: "", wantErr: "want <namespace>/<name>"},
		{value: "a/b/c", wantErr: "want <namespace>/<name>"},
		{value: "/name", wantErr: `namespace ""`},
		{value: "Backup/default", wantErr: `namespace "Backup"`},
		{value: "backup/", wantErr: `name ""`},
		{value: "backup/Default", wantErr: `name "Default"`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := ParseServerRef(tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), "guestbackup.io/server") {
					t.Errorf("error %q does not name the annotation", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseServerRef(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
			}
		})
	}
}

func TestUsername(t *testing.T) {
	tests := []struct {
		vm, namespace string
		want          string
		wantErr       bool
	}{
		{vm: "web-1", namespace: "prod", want: "web-1@prod"},
		{vm: "db.primary", namespace: "team-a", want: "db.primary@team-a"},
		{vm: "Web", namespace: "prod", wantErr: true},
		{vm: "", namespace: "prod", wantErr: true},
		{vm: strings.Repeat("v", 63), namespace: "prod", want: strings.Repeat("v", 63) + "@prod"},
		// The VM's Secret is labelled with its name: 63 characters at most.
		{vm: strings.Repeat("v", 64), namespace: "prod", wantErr: true},
	}
	for _, tt := range tests {
		got, err := Username(tt.vm, tt.namespace)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("Username(%q, %q) = %q, %v; want %q (error: %v)", tt.vm, tt.namespace, got, err, tt.want, tt.wantErr)
		}
	}
}
