package mutate

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// TestACopyGetsItsOwnIdentity: a copy of an injected VM (a
// VirtualMachineClone copies annotations; so does get -o yaml, rename,
// apply) reads its source's Secret. It is issued credentials and a Secret
// of its own, and its volumes read that; the owner's own user-data comes
// from the source's Secret, which is only read.
func TestACopyGetsItsOwnIdentity(t *testing.T) {
	for _, tt := range []struct{ fixture, volume string }{
		{"no-cloud-init", CloudInitVolume},
		{"inline-cloud-config", "cloudinitdisk"},
		{"base64-cloud-config", "cloudinitdisk"},
		{"mode-disk", DiskVolume},
	} {
		for _, stripped := range []bool{false, true} {
			name := tt.fixture
			if stripped {
				name += ", without the status annotation"
			}
			t.Run(name, func(t *testing.T) {
				original := readVM(t, tt.fixture)
				stored, source := injected(t, tt.fixture)
				sourceBefore := source.DeepCopy()
				clone := withField(t, stored, "copy", "metadata", "name")
				if stripped {
					clone = withoutAnnotations(t, clone, v1alpha1.AnnotationStatus)
				}
				d, err := Decide(Input{Object: clone, Namespace: "team-a", Server: readyServer(), NewPassword: (&passwords{n: 100}).next,
					Sources: map[string]*corev1.Secret{source.Name: source}})
				if err != nil {
					t.Fatal(err)
				}
				if d.Denied != "" || d.Secret == nil {
					t.Fatalf("denied %q, Secret written %t; want the copy issued its own", d.Denied, d.Secret != nil)
				}
				if d.Secret.Name != "copy-guestbackup" || vmsecret.VM(d.Secret) != "copy" || string(d.Secret.Data[v1alpha1.SecretKeyUsername]) != "copy@team-a" ||
					bytes.Equal(d.Secret.Data[v1alpha1.SecretKeyPassword], source.Data[v1alpha1.SecretKeyPassword]) {
					t.Errorf("the copy's Secret %s is not its own: %v", d.Secret.Name, d.Secret.Labels)
				}
				if d.Secret.Annotations[vmsecret.AnnotationIssuedEvent] == "" {
					t.Error("no CredentialsIssued for the copy")
				}
				if !equalSecrets(source, sourceBefore) {
					t.Error("the source's Secret changed")
				}
				if own := d.Secret.Data[v1alpha1.SecretKeyUserData]; own != nil {
					if part, err := cloudinit.UserPart(own); err == nil {
						want, _ := cloudinit.UserPart(source.Data[v1alpha1.SecretKeyUserData])
						if !bytes.Equal(part, want) {
							t.Errorf("the owner's user-data in the copy's Secret:\n%s\nwant\n%s", part, want)
						}
					}
				}
				mutated := apply(t, clone, d)
				checkKubeVirtRules(t, mutated)
				var vm kubevirtv1.VirtualMachine
				if err := json.Unmarshal(mutated, &vm); err != nil {
					t.Fatal(err)
				}
				for _, v := range vm.Spec.Template.Spec.Volumes {
					for _, name := range vmsecret.SecretsRead(v.VolumeSource) {
						if name != "copy-guestbackup" {
							t.Errorf("volume %s still reads Secret %s", v.Name, name)
						}
					}
				}
				var st v1alpha1.InjectionStatus
				if err := json.Unmarshal([]byte(vm.Annotations[v1alpha1.AnnotationStatus]), &st); err != nil || st.Secret != "copy-guestbackup" || st.User != "copy@team-a" || st.Volume != tt.volume {
					t.Errorf("status %+v (%v)", st, err)
				}

				again, err := Decide(Input{Object: mutated, OldObject: mutated, Namespace: "team-a", Server: readyServer(), Secret: d.Secret, NewPassword: (&passwords{}).next,
					Sources: map[string]*corev1.Secret{source.Name: source}})
				if err != nil || again.Denied != "" || len(again.Patch) != 0 || again.Secret != nil {
					t.Errorf("admitting the copy again: %+v (%v)", again, err)
				}
				if stripped && tt.fixture == "base64-cloud-config" {
					return // without the status, which field the user-data came from is not known: it goes back to userData
				}
				out := decide(t, withoutServer(t, mutated), d.Secret, &passwords{})
				want := withField(t, withoutServer(t, original), "copy", "metadata", "name")
				if restored := apply(t, withoutServer(t, mutated), out); !jsonEqual(restored, want) {
					t.Errorf("the copy opted out:\n%s\nwant\n%s", restored, want)
				}
			})
		}
	}
}

func TestACopyWhoseSourceSecretIsGone(t *testing.T) {
	stored, _ := injected(t, "inline-cloud-config")
	clone := withField(t, stored, "copy", "metadata", "name")
	d, err := Decide(Input{Object: clone, Namespace: "team-a", Server: readyServer(), NewPassword: (&passwords{}).next})
	if err != nil {
		t.Fatal(err)
	}
	want := "VirtualMachine team-a/copy is a copy of a VM guestbackup injected: its volume cloudinitdisk reads Secret db-guestbackup, which does not exist any more, and only it held the owner's own user-data"
	if !strings.Contains(d.Denied, want) || !strings.Contains(d.Denied, "put the VM's own cloud-init back into volume cloudinitdisk (userData) and remove annotation guestbackup.io/status") {
		t.Errorf("denial %q, want it to contain %q and what to do", d.Denied, want)
	}
}

// Someone who may create VMs but not read Secrets copies an injected VM's
// status and volume into a VM that does not opt in: the webhook, which
// reads the source's Secret, must not patch that VM's owner's user-data into
// the copy's spec, where a dry run would show it and leave no trace.
func TestACopyThatDoesNotOptInGetsNoOneElsesUserData(t *testing.T) {
	stored, source := injected(t, "inline-cloud-config")
	copied := withoutServer(t, withField(t, stored, "copy", "metadata", "name"))
	d, err := Decide(Input{Object: copied, Namespace: "team-a", Server: readyServer(), NewPassword: (&passwords{}).next,
		Sources: map[string]*corev1.Secret{source.Name: source}})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := cloudinit.UserPart(source.Data[v1alpha1.SecretKeyUserData])
	if patch, _ := json.Marshal(d.Patch); len(own) == 0 || bytes.Contains(patch, []byte("owner-marker")) || strings.Contains(string(patch), strings.TrimSpace(string(own))) {
		t.Errorf("the copy's patch carries its source's user-data: %s", patch)
	}
	if !strings.Contains(d.Denied, "opt this copy in (annotation guestbackup.io/server)") {
		t.Errorf("denial %q, want it to say how to opt the copy in", d.Denied)
	}
}

func equalSecrets(a, b *corev1.Secret) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
