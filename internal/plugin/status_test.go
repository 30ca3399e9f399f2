package plugin

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/golden"
)

// now is the moment the goldens are rendered at.
var now = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// TestStatusOutput renders, for each case under testdata/status, the
// table of its protections.yaml, in one namespace's view and across
// namespaces, and each VM's details.
func TestStatusOutput(t *testing.T) {
	dir := filepath.Join("testdata", "status")
	for _, name := range golden.Cases(t, dir) {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, name, "protections.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			list := &v1alpha1.GuestProtectionList{}
			if err := yaml.UnmarshalStrict(data, list); err != nil {
				t.Fatal(err)
			}
			got := map[string][]byte{}
			var table, all bytes.Buffer
			if err := printTable(&table, list.Items, false, now); err != nil {
				t.Fatal(err)
			}
			if err := printTable(&all, list.Items, true, now); err != nil {
				t.Fatal(err)
			}
			got["table.txt"], got["table-all-namespaces.txt"] = table.Bytes(), all.Bytes()
			for i := range list.Items {
				p := &list.Items[i]
				var detail bytes.Buffer
				if err := printDetail(&detail, p, now); err != nil {
					t.Fatal(err)
				}
				got["detail-"+p.Namespace+"-"+p.Name+".txt"] = detail.Bytes()
			}
			golden.Check(t, filepath.Join(dir, name), got, "protections.yaml")
		})
	}
}

func TestStatusExit(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "status", "fleet", "protections.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	list := &v1alpha1.GuestProtectionList{}
	if err := yaml.Unmarshal(data, list); err != nil {
		t.Fatal(err)
	}
	byName := map[string]v1alpha1.GuestProtection{}
	for _, p := range list.Items {
		byName[p.Name] = p
	}
	tests := []struct {
		name string
		vms  []string
		want int
	}{
		{name: "none shown", want: ExitOK},
		{name: "fresh and connected", vms: []string{"web"}, want: ExitOK},
		{name: "stale", vms: []string{"db"}, want: ExitNotFresh},
		{name: "never connected", vms: []string{"batch"}, want: ExitNotFresh},
		{name: "one of several stale", vms: []string{"web", "db"}, want: ExitNotFresh},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ps []v1alpha1.GuestProtection
			for _, n := range tt.vms {
				ps = append(ps, byName[n])
			}
			if got := statusExit(ps); got != tt.want {
				t.Errorf("statusExit = %d, want %d", got, tt.want)
			}
		})
	}
}
