package mutate

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// FuzzDecide admits arbitrary VirtualMachine JSON: Decide never panics,
// and every patch it returns applies cleanly to what it was given.
func FuzzDecide(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*", "vm.yaml"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		obj, err := yaml.YAMLToJSON(data)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(obj)
	}
	f.Add([]byte(`{"metadata":{"name":"a","annotations":{"guestbackup.io/server":"backup/main","guestbackup.io/status":"{\"mode\":\"disk\",\"secret\":\"a-guestbackup\",\"volume\":\"guestbackup\",\"disk\":\"guestbackup\"}"}},"spec":{"template":{"spec":{}}}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, obj []byte) {
		pw := &passwords{}
		d, err := Decide(Input{Object: obj, Namespace: "team-a", Server: readyServer(), NewPassword: pw.next})
		if err != nil {
			t.Fatalf("internal error: %v", err)
		}
		if len(d.Patch) == 0 {
			return
		}
		if _, err := testbed.ApplyPatch(obj, d.Patch); err != nil {
			t.Fatalf("%v, to %s", err, obj)
		}
	})
}
