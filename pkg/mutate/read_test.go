package mutate

import (
	"strings"
	"testing"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// TestThePatchFitsEveryShapeOfTemplate admits VMs whose template lacks,
// has null, or has empty each container on the paths the webhook appends
// to, and VMs whose JSON the API's decoders and a JSON patch read
// differently. Each patch is applied the way the API server applies it
// (evanphx/json-patch, to the object as sent): it must apply, put exactly
// guestbackup's volume and disk in, and keep everything else; or the VM is
// denied with what to fix.
func TestThePatchFitsEveryShapeOfTemplate(t *testing.T) {
	const head = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"shape","namespace":"team-a","annotations":{"guestbackup.io/server":"backup/main"}},"spec":{"runStrategy":"Halted",`
	own := `{"name":"root","containerDisk":{"image":"debian"}}`
	for name, tc := range map[string]struct {
		template string
		// volumes and disks are the names the template has after the
		// patch, in order.
		volumes, disks []string
		// denied is part of the denial, when the VM is denied.
		denied string
	}{
		"a template without a spec": {
			template: `{}`, volumes: []string{CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"a spec of null": {
			template: `{"spec":null}`, volumes: []string{CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"volumes and domain absent": {
			template: `{"spec":{}}`, volumes: []string{CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"volumes and disks null": {
			template: `{"spec":{"volumes":null,"domain":{"devices":{"disks":null}}}}`, volumes: []string{CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"volumes and disks empty": {
			template: `{"spec":{"volumes":[],"domain":{"devices":{"disks":[]}}}}`, volumes: []string{CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"a domain of null": {
			template: `{"spec":{"volumes":[` + own + `],"domain":null}}`, volumes: []string{"root", CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"devices absent": {
			template: `{"spec":{"volumes":[` + own + `],"domain":{"cpu":{"cores":2}}}}`, volumes: []string{"root", CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"devices without disks": {
			template: `{"spec":{"volumes":[` + own + `],"domain":{"devices":{"autoattachSerialConsole":true}}}}`, volumes: []string{"root", CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		"volumes and disks of its own": {
			template: `{"spec":{"volumes":[` + own + `],"domain":{"devices":{"disks":[{"name":"root","disk":{"bus":"virtio"}}]}}}}`,
			volumes:  []string{"root", CloudInitVolume}, disks: []string{"root", CloudInitVolume},
		},
		// The API's field names are case-sensitive: "Volumes" is not its
		// volumes (KubeVirt's own decoder reads it as if it were).
		"a list in another case": {
			template: `{"spec":{"Volumes":[` + own + `],"domain":{"devices":{}}}}`, volumes: []string{CloudInitVolume}, disks: []string{CloudInitVolume},
		},
		// A JSON patch applies to the last of two fields of one name, a
		// decoder merges them: whichever guestbackup read, the other could
		// differ.
		"a field given twice on the patch's path": {
			template: `{"spec":{"volumes":[` + own + `]},"spec":{"domain":{}}}`, denied: `duplicate field "spec.template.spec"`,
		},
		"a list that is no list": {
			template: `{"spec":{"volumes":{"name":"root"}}}`, denied: "cannot read this VirtualMachine",
		},
	} {
		t.Run(name, func(t *testing.T) {
			obj := []byte(head + `"template":` + tc.template + `}}`)
			d := decide(t, obj, nil, &passwords{})
			if tc.denied != "" {
				if !strings.Contains(d.Denied, tc.denied) || len(d.Patch) != 0 {
					t.Fatalf("want a denial saying %q, got %q and %d operations", tc.denied, d.Denied, len(d.Patch))
				}
				return
			}
			if d.Denied != "" {
				t.Fatalf("denied: %s", d.Denied)
			}
			out, err := testbed.ApplyPatch(obj, d.Patch)
			if err != nil {
				t.Fatalf("the API server would not apply it: %v", err)
			}
			var got struct {
				Spec struct {
					Template struct {
						Spec struct {
							Volumes []struct{ Name string } `json:"volumes"`
							Domain  struct {
								CPU     any `json:"cpu"`
								Devices struct {
									Disks                   []struct{ Name string } `json:"disks"`
									AutoattachSerialConsole *bool                   `json:"autoattachSerialConsole"`
								} `json:"devices"`
							} `json:"domain"`
						} `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := decodeJSON(out, &got); err != nil {
				t.Fatal(err)
			}
			names := func(items []struct{ Name string }) []string {
				var n []string
				for _, i := range items {
					n = append(n, i.Name)
				}
				return n
			}
			spec := got.Spec.Template.Spec
			if v, w := strings.Join(names(spec.Volumes), ","), strings.Join(tc.volumes, ","); v != w {
				t.Errorf("volumes %s, want %s (patch %+v)", v, w, d.Patch)
			}
			if v, w := strings.Join(names(spec.Domain.Devices.Disks), ","), strings.Join(tc.disks, ","); v != w {
				t.Errorf("disks %s, want %s (patch %+v)", v, w, d.Patch)
			}
			if strings.Contains(tc.template, `"cores"`) && spec.Domain.CPU == nil {
				t.Errorf("the domain's cpu was lost (patch %+v)", d.Patch)
			}
			if strings.Contains(tc.template, "autoattachSerialConsole") && spec.Domain.Devices.AutoattachSerialConsole == nil {
				t.Errorf("the devices' autoattachSerialConsole was lost (patch %+v)", d.Patch)
			}
		})
	}
}

// TestAVMBeingDeletedIsIgnoredWhateverItsJSON: a deletion never waits on
// guestbackup, not even for a field given twice.
func TestAVMBeingDeletedIsIgnoredWhateverItsJSON(t *testing.T) {
	obj := []byte(`{"metadata":{"name":"gone","deletionTimestamp":"2026-01-01T00:00:00Z","annotations":{"guestbackup.io/server":"backup/main"}},"spec":{"template":{}},"spec":{"template":{}}}`)
	if d := decide(t, obj, nil, &passwords{}); d.Outcome != OutcomeIgnored || d.Denied != "" {
		t.Errorf("a VM being deleted: %+v", d)
	}
}
