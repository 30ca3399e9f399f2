package plugin

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/golden"
)

// readProtection reads the GuestProtection of a case under testdata.
func readProtection(t *testing.T, path string) *v1alpha1.GuestProtection {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := &v1alpha1.GuestProtection{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSnapshotsOutput renders, for each case under testdata/snapshots,
// what `snapshots` prints of its protection.yaml: the table on standard
// output and what it does not show on standard error, and the catalogue
// as -o json and -o yaml print it.
func TestSnapshotsOutput(t *testing.T) {
	dir := filepath.Join("testdata", "snapshots")
	for _, name := range golden.Cases(t, dir) {
		t.Run(name, func(t *testing.T) {
			p := readProtection(t, filepath.Join(dir, name, "protection.yaml"))
			l := catalogueOf(p)
			var out, errOut, js, ym bytes.Buffer
			if err := printCatalogue(&out, &errOut, l, p.Status.Server, now); err != nil {
				t.Fatal(err)
			}
			if err := printJSON(&js, l); err != nil {
				t.Fatal(err)
			}
			if err := printYAML(&ym, l); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, filepath.Join(dir, name), map[string][]byte{
				"stdout.txt": out.Bytes(), "stderr.txt": errOut.Bytes(),
				"stdout.json": js.Bytes(), "stdout.yaml": ym.Bytes(),
			}, "protection.yaml")
		})
	}
}

// TestSnapshotsShow holds what `snapshots` prints and exits with to what
// the API server answers for the VM's GuestProtection.
func TestSnapshotsShow(t *testing.T) {
	web := readProtection(t, filepath.Join("testdata", "snapshots", "newest-of-many", "protection.yaml"))
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "guestprotections"}, "web",
		errors.New(`User "owner@example.com" cannot get resource "guestprotections" in API group "guestbackup.io" in the namespace "apps"`))
	golden := func(name string) string {
		data, err := os.ReadFile(filepath.Join("testdata", "snapshots", "newest-of-many", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	tests := []struct {
		name       string
		output     string
		vm         string
		refuse     error
		wantOut    string
		wantErrOut string
		wantCode   int
		wantErr    string
	}{
		{name: "a protected VM, newest first", vm: "web", wantOut: golden("stdout.txt"), wantErrOut: golden("stderr.txt")},
		{name: "as JSON", vm: "web", output: "json", wantOut: golden("stdout.json")},
		{name: "as YAML", vm: "web", output: "yaml", wantOut: golden("stdout.yaml")},
		{
			name:     "a VM that is not protected",
			vm:       "nope",
			wantCode: ExitNotProtected,
			wantErr:  "VirtualMachine apps/nope is not protected by guestbackup: it has no GuestProtection. Annotate it guestbackup.io/server=<namespace>/<server> to opt it in (kubectl describe vm nope says why if it was refused), or wait a minute after doing so",
		},
		{
			name:     "a namespace the owner may not read",
			vm:       "web",
			output:   "json",
			refuse:   forbidden,
			wantCode: ExitFailed,
			wantErr:  "read the GuestProtection of apps/web: " + forbidden.Error(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeAPI(t)
			if err := c.Create(context.Background(), web.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			if tt.refuse != nil {
				c = interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
					Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
						return tt.refuse
					},
				})
			}
			var out, errOut strings.Builder
			err := snapshotsOptions{output: tt.output}.show(context.Background(), c, genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, "apps", tt.vm, now)

			if code := exitCode(t, err); code != tt.wantCode {
				t.Errorf("exit code %d, want %d (%v)", code, tt.wantCode, err)
			}
			if tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr) {
				t.Errorf("error %v, want %q", err, tt.wantErr)
			}
			if d := cmp.Diff(tt.wantOut, out.String()); d != "" {
				t.Errorf("standard output (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.wantErrOut, errOut.String()); d != "" {
				t.Errorf("standard error (-want +got):\n%s", d)
			}
		})
	}
}

// TestSnapshotsArguments holds `snapshots` to refusing, before it reads
// anything, what names no VM or no output format.
func TestSnapshotsArguments(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{args: []string{"snapshots"}, wantErr: "accepts 1 arg(s), received 0"},
		{args: []string{"snapshots", "web", "db"}, wantErr: "accepts 1 arg(s), received 2"},
		{args: []string{"snapshots", "pod/web"}, wantErr: `"pod/web" names no VirtualMachine: give NAME or vm/NAME`},
		{args: []string{"snapshots", "vm/web", "-o", "wide"}, wantErr: `--output "wide": want json or yaml`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
			// No cluster: a command that tried to reach one would fail
			// otherwise than expected.
			cmd.SetArgs(append(tt.args, "--kubeconfig", filepath.Join(t.TempDir(), "none")))
			err := cmd.Execute()
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
}
