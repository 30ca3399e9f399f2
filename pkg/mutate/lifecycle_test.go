package mutate

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// withField is obj with the value at path (objects created as needed) set;
// a nil value removes it.
func withField(t *testing.T, obj []byte, value any, path ...string) []byte {
	t.Helper()
	var m map[string]any
	if err := decodeJSON(obj, &m); err != nil {
		t.Fatal(err)
	}
	cur := m
	for _, p := range path[:len(path)-1] {
		next, ok := cur[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[p] = next
		}
		cur = next
	}
	if value == nil {
		delete(cur, path[len(path)-1])
	} else {
		cur[path[len(path)-1]] = value
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// injected is the no-cloud-init VM as the webhook stored it, and its Secret.
func injected(t *testing.T, name string) ([]byte, *corev1.Secret) {
	t.Helper()
	original := readVM(t, name)
	first := decide(t, original, nil, &passwords{})
	if first.Denied != "" {
		t.Fatal(first.Denied)
	}
	return apply(t, original, first), first.Secret
}

// TestNeverBlocksAnInjectedVM: a VM that already carries its bootstrap is
// never denied for its server's health: start, stop, edits and the
// finalizer removal of a deleting VM do not wait on a BSLS.
func TestNeverBlocksAnInjectedVM(t *testing.T) {
	stored, secret := injected(t, "no-cloud-init")
	hashPending := readyServer()
	hashPending.BSLS.Status.Conditions[0] = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "UsersSynced", Message: "Not True: UsersSynced"}
	certRolling := readyServer()
	certRolling.BSLS.Status.Conditions[0] = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "CertificateReady", Message: "Not True: CertificateReady"}
	noEndpoint := readyServer()
	noEndpoint.BSLS.Status = v1alpha1.BackupStorageLocationServerStatus{}
	notAdmitted := readyServer()
	notAdmitted.NamespaceAllowed = false

	edited := withField(t, stored, "Halted", "spec", "runStrategy")
	edited = withField(t, edited, map[string]any{"tier": "db"}, "metadata", "labels")
	for name, server := range map[string]Server{
		"not Ready while a new VM's hash is pending": hashPending,
		"not Ready while its certificate rolls":      certRolling,
		"with no endpoint published":                 noEndpoint,
		"that no longer admits the namespace":        notAdmitted,
		"deleted":                                    {},
	} {
		t.Run("a server "+name, func(t *testing.T) {
			d, err := Decide(Input{Object: edited, OldObject: stored, Namespace: "team-a", Server: server, Secret: secret, NewPassword: (&passwords{}).next})
			if err != nil {
				t.Fatal(err)
			}
			if d.Denied != "" || len(d.Patch) != 0 || d.Secret != nil {
				t.Errorf("an edit of an injected VM: denied %q, patch %+v, Secret written %t; want it admitted unchanged", d.Denied, d.Patch, d.Secret != nil)
			}
		})
	}

	t.Run("a changed annotation while the server is gone is admitted, and says it waits", func(t *testing.T) {
		changed := withAnnotation(t, stored, v1alpha1.AnnotationPaths, "/var/lib/app")
		d, err := Decide(Input{Object: changed, OldObject: stored, Namespace: "team-a", Secret: secret, NewPassword: (&passwords{}).next})
		if err != nil {
			t.Fatal(err)
		}
		if d.Denied != "" || len(d.Patch) != 0 || d.Secret != nil {
			t.Fatalf("denied %q, patch %+v, Secret written %t; want it admitted unchanged", d.Denied, d.Patch, d.Secret != nil)
		}
		if len(d.Events) != 1 || d.Events[0].Type != corev1.EventTypeWarning || d.Events[0].Reason != ReasonInjectionNotUpdated ||
			!strings.Contains(d.Events[0].Message, "BackupStorageLocationServer backup/main does not exist: the VM is admitted and its Secret web-guestbackup kept as it was") {
			t.Errorf("events: %+v", d.Events)
		}
	})

	t.Run("the owner's manifest applied again while the server is gone is admitted, and says what waits", func(t *testing.T) {
		reapplied := withField(t, stored, []any{map[string]any{"name": "root", "containerDisk": map[string]any{"image": "quay.io/containerdisks/debian:12"}}}, "spec", "template", "spec", "volumes")
		d, err := Decide(Input{Object: reapplied, OldObject: stored, Namespace: "team-a", Secret: secret, NewPassword: (&passwords{}).next})
		if err != nil {
			t.Fatal(err)
		}
		if d.Denied != "" || len(d.Patch) != 0 || d.Secret != nil {
			t.Fatalf("denied %q, patch %+v, Secret written %t; want it admitted as it is", d.Denied, d.Patch, d.Secret != nil)
		}
		if len(d.Events) != 1 || d.Events[0].Reason != ReasonInjectionNotUpdated ||
			!strings.Contains(d.Events[0].Message, "the VM is admitted without the volume guestbackup-cloudinit that reads its Secret web-guestbackup, which this update removed; guestbackup adds it again when") {
			t.Errorf("events: %+v", d.Events)
		}
	})
}

// TestADeletingVMIsAdmittedUnchanged: nothing holds up a deletion, and a
// deleting VM is never issued credentials.
func TestADeletingVMIsAdmittedUnchanged(t *testing.T) {
	stored, secret := injected(t, "no-cloud-init")
	deleting := withField(t, stored, "2026-11-25T07:00:00Z", "metadata", "deletionTimestamp")
	for name, in := range map[string]Input{
		"its finalizer removed":         {Object: withField(t, deleting, nil, "metadata", "finalizers"), OldObject: deleting, Secret: secret},
		"rotated while it is deleted":   {Object: withAnnotation(t, deleting, v1alpha1.AnnotationRotate, "now"), OldObject: deleting, Secret: secret},
		"its Secret gone":               {Object: deleting, OldObject: deleting},
		"its server gone":               {Object: deleting, OldObject: deleting, Secret: secret, Server: Server{}},
		"opted out while it is deleted": {Object: withoutServer(t, deleting), OldObject: deleting, Secret: secret},
	} {
		t.Run(name, func(t *testing.T) {
			in.Namespace, in.NewPassword = "team-a", (&passwords{}).next
			if name != "its server gone" {
				in.Server = readyServer()
			}
			d, err := Decide(in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Denied != "" || len(d.Patch) != 0 || d.Secret != nil || len(d.Events) != 0 {
				t.Errorf("a deleting VM: %+v; want it admitted unchanged", d)
			}
		})
	}
}

// TestANewVMNeedsWhatItsBootstrapNeeds: a new VM is admitted while its
// server is not Ready for reasons that do not concern it (a previous VM's
// hash pending, a certificate renewal): it needs the endpoint and the CA.
func TestANewVMNeedsWhatItsBootstrapNeeds(t *testing.T) {
	base := readVM(t, "no-cloud-init")
	for _, reason := range []string{"UsersSynced", "CertificateReady", "ServerAvailable"} {
		server := readyServer()
		server.BSLS.Status.Conditions[0] = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: "Not True: " + reason}
		d, err := Decide(Input{Object: base, Namespace: "team-a", Server: server, NewPassword: (&passwords{}).next})
		if err != nil {
			t.Fatal(err)
		}
		if d.Denied != "" || d.Secret == nil {
			t.Errorf("Ready=False (%s): denied %q; want the VM admitted with its credentials", reason, d.Denied)
		}
	}
}

// withoutAnnotations is obj without the annotations keys.
func withoutAnnotations(t *testing.T, obj []byte, keys ...string) []byte {
	t.Helper()
	var m map[string]any
	if err := decodeJSON(obj, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		delete(m["metadata"].(map[string]any)["annotations"].(map[string]any), k)
	}
	out, _ := json.Marshal(m)
	return out
}

// TestRemovingAnnotationsLosesNothing: whatever guestbackup annotations an
// update removes, the owner's own cloud-init survives: removing the
// opt-in gives it back where it was, removing only the status (which the
// webhook manages) puts the status back.
func TestRemovingAnnotationsLosesNothing(t *testing.T) {
	for _, name := range []string{"inline-cloud-config", "base64-cloud-config", "no-cloud-init", "mode-disk", "secret-ref"} {
		t.Run(name, func(t *testing.T) {
			original := readVM(t, name)
			stored, secret := injected(t, name)
			admit := func(obj []byte) []byte {
				t.Helper()
				d, err := Decide(Input{Object: obj, OldObject: stored, Namespace: "team-a", Server: readyServer(), Secret: secret, NewPassword: (&passwords{}).next})
				if err != nil {
					t.Fatal(err)
				}
				if d.Denied != "" || d.Secret != nil || len(d.Events) != 0 {
					t.Fatalf("denied %q, Secret written %t, events %+v", d.Denied, d.Secret != nil, d.Events)
				}
				return apply(t, obj, d)
			}
			t.Run("both annotations in one update", func(t *testing.T) {
				got := admit(withoutAnnotations(t, stored, v1alpha1.AnnotationServer, v1alpha1.AnnotationStatus))
				if want := withoutServer(t, original); !jsonEqual(got, want) {
					t.Errorf("after the update:\n%s\nwant the VM as it was before it opted in:\n%s", got, want)
				}
			})
			t.Run("only the status", func(t *testing.T) {
				if got := admit(withoutAnnotations(t, stored, v1alpha1.AnnotationStatus)); !jsonEqual(got, stored) {
					t.Errorf("after the update:\n%s\nwant the injected VM as it was:\n%s", got, stored)
				}
			})
		})
	}
}

// TestCredentialsIssuedWaitsForTheUID: an Event without the VM's UID is
// never shown by kubectl describe. At creation the message waits in the
// Secret for the controller; at an update the VM has its UID.
func TestCredentialsIssuedWaitsForTheUID(t *testing.T) {
	created := decide(t, readVM(t, "no-cloud-init"), nil, &passwords{})
	if len(created.Events) != 0 || created.Secret.Annotations[vmsecret.AnnotationIssuedEvent] == "" {
		t.Errorf("at creation: events %+v, issued-event %q; want the Event in the Secret", created.Events, created.Secret.Annotations[vmsecret.AnnotationIssuedEvent])
	}
	plain := withField(t, withoutServer(t, readVM(t, "no-cloud-init")), "uid-1", "metadata", "uid")
	optedIn := withAnnotation(t, plain, v1alpha1.AnnotationServer, "backup/main")
	d, err := Decide(Input{Object: optedIn, OldObject: plain, Namespace: "team-a", Server: readyServer(), NewPassword: (&passwords{}).next})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Events) != 1 || d.Events[0].Reason != ReasonCredentialsIssued || d.Secret.Annotations[vmsecret.AnnotationIssuedEvent] != "" {
		t.Errorf("an opt-in by update: events %+v, issued-event %q; want the Event recorded at once", d.Events, d.Secret.Annotations[vmsecret.AnnotationIssuedEvent])
	}
}

// TestGuestsThatReadNoNoCloud: a Windows guest (sysprep) and an Ignition
// guest never read a NoCloud volume: they are told what to do rather than
// given one; a guest whose bootstrap goes on a disk is told it needs the
// disk unit.
func TestGuestsThatReadNoNoCloud(t *testing.T) {
	base := readVM(t, "no-cloud-init")
	var m map[string]any
	if err := decodeJSON(base, &m); err != nil {
		t.Fatal(err)
	}
	tmpl := m["spec"].(map[string]any)["template"].(map[string]any)
	tmplSpec := tmpl["spec"].(map[string]any)
	tmplSpec["volumes"] = append(tmplSpec["volumes"].([]any), map[string]any{"name": "sysprep", "sysprep": map[string]any{"secret": map[string]any{"name": "answers"}}})
	windows, _ := json.Marshal(m)
	ignition := withField(t, base, `{"ignition":{"version":"3.3.0"}}`, "spec", "template", "metadata", "annotations", "kubevirt.io/ignitiondata")

	for _, tt := range []struct {
		name string
		obj  []byte
		want string
	}{
		{"a Windows guest (sysprep)", windows, "VirtualMachine team-a/web is configured by sysprep (volume sysprep): guestbackup bootstraps Linux guests through cloud-init or a disk its unit reads, and a Windows guest reads neither; remove annotation guestbackup.io/server"},
		{"an Ignition guest", ignition, "VirtualMachine team-a/web is configured by Ignition (annotation kubevirt.io/ignitiondata of spec.template), which reads no NoCloud volume: install guestbackup's disk unit through your Ignition config (docs/guest.md, Disk mode) and set annotation guestbackup.io/mode=disk, or remove annotation guestbackup.io/server"},
		{"an Ignition guest forced to cloud-init", withAnnotation(t, ignition, v1alpha1.AnnotationMode, "cloud-init"), "is configured by Ignition"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(Input{Object: tt.obj, Namespace: "team-a", Server: readyServer(), NewPassword: (&passwords{}).next})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(d.Denied, tt.want) || d.Secret != nil {
				t.Errorf("denial %q, want it to contain %q", d.Denied, tt.want)
			}
		})
	}

	t.Run("an Ignition guest in disk mode", func(t *testing.T) {
		d := decide(t, withAnnotation(t, ignition, v1alpha1.AnnotationMode, "disk"), nil, &passwords{})
		if d.Denied != "" || d.Secret == nil {
			t.Errorf("denied %q: the owner installs the disk unit through Ignition", d.Denied)
		}
	})
	t.Run("a ConfigDrive guest is told it needs the disk unit", func(t *testing.T) {
		d := decide(t, readVM(t, "config-drive"), nil, &passwords{})
		if msg := d.Secret.Annotations[vmsecret.AnnotationIssuedEvent]; !strings.Contains(msg, "disk mode because it uses a cloudInitConfigDrive volume: the guest needs guestbackup's disk unit (docs/guest.md, Disk mode)") {
			t.Errorf("CredentialsIssued %q", msg)
		}
	})
}

// TestReCreatingAVMLosesNothing: a VM deleted while its credential Secret
// outlives it (kubectl delete --cascade=orphan, the garbage collector's
// window, the controller's settle time) and created again from a manifest
// that kept its volumes but not the status annotation is the same VM
// again. Its own Secret is never taken for a foreign one: the owner's
// user-data in it, the placement and the credentials are carried over,
// and the reference to the deleted VM, for which a garbage collector
// would delete the Secret, is dropped.
func TestReCreatingAVMLosesNothing(t *testing.T) {
	for _, name := range []string{"inline-cloud-config", "base64-cloud-config", "no-cloud-init", "mode-disk", "secret-ref"} {
		t.Run(name, func(t *testing.T) {
			stored, secret := injected(t, name)
			secret = secret.DeepCopy()
			secret.OwnerReferences = []metav1.OwnerReference{vmsecret.OwnerReference(headOf(stored).Name, "uid-of-the-deleted-vm")}
			recreated := withoutAnnotations(t, stored, v1alpha1.AnnotationStatus)

			d, err := Decide(Input{Object: recreated, Namespace: "team-a", Server: readyServer(), Secret: secret, NewPassword: (&passwords{n: 100}).next})
			if err != nil {
				t.Fatal(err)
			}
			if d.Denied != "" {
				t.Fatalf("denied: %s", d.Denied)
			}
			got := apply(t, recreated, d)
			gotStatus, _, _ := vmsecret.ParseStatus(headOf(got).Annotations)
			wantStatus, _, _ := vmsecret.ParseStatus(headOf(stored).Annotations)
			if wantStatus.MergedFrom != "" {
				// The field it was merged from is recorded nowhere else.
				wantStatus.MergedFrom = "userData"
			}
			if gotStatus != wantStatus {
				t.Errorf("status %+v, want what was injected: %+v", gotStatus, wantStatus)
			}
			if !jsonEqual(withoutAnnotations(t, got, v1alpha1.AnnotationStatus), recreated) {
				t.Errorf("the re-created VM was changed:\n%s\nwant it as created:\n%s", got, recreated)
			}
			if d.Secret == nil {
				t.Fatal("the Secret was left referring to the deleted VM")
			}
			if len(d.Secret.OwnerReferences) != 0 {
				t.Errorf("owner references %v: want the deleted VM's dropped", d.Secret.OwnerReferences)
			}
			if string(d.Secret.Data[vmsecret.KeyPassword]) != string(secret.Data[vmsecret.KeyPassword]) {
				t.Error("the credentials the guest holds were replaced")
			}
			if want, got := string(secret.Data[vmsecret.KeyUserData]), string(d.Secret.Data[vmsecret.KeyUserData]); got != want {
				t.Errorf("user-data in the Secret:\n%s\nwant it kept:\n%s", got, want)
			}
		})
	}
}

// TestAForgedStatusSkipsNoCheck: the status annotation is written by the
// webhook, but a tenant can write it too. It is taken as proof of an
// earlier injection only when the stored VM carries it or the VM's own
// credential Secret, which only guestbackup writes, names its server; a
// VM of a namespace the BSLS does not admit, or naming a BSLS that does
// not exist, is refused however it is annotated, on CREATE and on UPDATE.
func TestAForgedStatusSkipsNoCheck(t *testing.T) {
	legit, _ := injected(t, "no-cloud-init")
	status := headOf(legit).Annotations[v1alpha1.AnnotationStatus]
	plain := withField(t, withoutServer(t, readVM(t, "no-cloud-init")), "uid-1", "metadata", "uid")
	forged := withAnnotation(t, withAnnotation(t, plain, v1alpha1.AnnotationServer, "backup/main"), v1alpha1.AnnotationStatus, status)
	notAdmitted := readyServer()
	notAdmitted.NamespaceAllowed = false
	for _, tt := range []struct {
		name   string
		old    []byte
		server Server
		want   string
	}{
		{"on CREATE, in a namespace the server does not admit", nil, notAdmitted, "does not admit VMs of namespace team-a"},
		{"on UPDATE, in a namespace the server does not admit", plain, notAdmitted, "does not admit VMs of namespace team-a"},
		{"on CREATE, naming a server that does not exist", nil, Server{}, "does not exist"},
		{"on UPDATE, naming a server that does not exist", plain, Server{}, "does not exist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(Input{Object: forged, OldObject: tt.old, Namespace: "team-a", Server: tt.server, NewPassword: (&passwords{}).next})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(d.Denied, tt.want) {
				t.Errorf("denial %q, want it to contain %q", d.Denied, tt.want)
			}
			if d.Secret != nil || len(d.Patch) != 0 {
				t.Error("a forged status got a Secret or a patch")
			}
		})
	}
}

// TestTheOwnersPartIsNeverRenderedAway: the VM's Secret may hold the only
// copy of the owner's own user-data. No admission writes a payload
// without it over it: not a re-creation whose status annotation says
// nothing was merged, nor an update that removed the volume it was merged
// from. Each is refused saying where the user-data is.
func TestTheOwnersPartIsNeverRenderedAway(t *testing.T) {
	stored, secret := injected(t, "inline-cloud-config")
	st, _, _ := vmsecret.ParseStatus(headOf(stored).Annotations)
	notMerged := st
	notMerged.MergedFrom = ""
	claim, err := json.Marshal(notMerged)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := decodeJSON(stored, &m); err != nil {
		t.Fatal(err)
	}
	spec := m["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	spec["volumes"] = spec["volumes"].([]any)[:1]
	spec["domain"].(map[string]any)["devices"].(map[string]any)["disks"] = spec["domain"].(map[string]any)["devices"].(map[string]any)["disks"].([]any)[:1]
	withoutVolume, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// A config drive reads the Secret's user-data as the NoCloud volume did.
	if err := decodeJSON(stored, &m); err != nil {
		t.Fatal(err)
	}
	volume := m["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"].([]any)[1].(map[string]any)
	volume["cloudInitConfigDrive"] = volume["cloudInitNoCloud"]
	delete(volume, "cloudInitNoCloud")
	toConfigDrive, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		obj, old []byte
	}{
		{"a re-creation whose status says nothing was merged", withAnnotation(t, stored, v1alpha1.AnnotationStatus, string(claim)), nil},
		{"an update that removed the volume it was merged from", withField(t, withoutVolume, "uid-1", "metadata", "uid"), withField(t, stored, "uid-1", "metadata", "uid")},
		{"an update that made the volume a config drive reading the Secret", withField(t, toConfigDrive, "uid-1", "metadata", "uid"), withField(t, stored, "uid-1", "metadata", "uid")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(Input{Object: tt.obj, OldObject: tt.old, Namespace: "team-a", Server: readyServer(), Secret: secret, NewPassword: (&passwords{}).next})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(d.Denied, "Secret team-a/db-guestbackup holds this VM's own cloud-init user-data") {
				t.Errorf("denial %q: want the owner's user-data kept, and said where it is", d.Denied)
			}
			if d.Secret != nil || len(d.Patch) != 0 {
				t.Error("the owner's user-data was rendered away")
			}
		})
	}
}

// TestReCreatingAVMThatAskedForARotation: the rotation a re-created VM's
// annotation names is the one its Secret's credentials were issued under,
// not a new one.
func TestReCreatingAVMThatAskedForARotation(t *testing.T) {
	original := withAnnotation(t, readVM(t, "inline-cloud-config"), v1alpha1.AnnotationRotate, "2026-12-01")
	first := decide(t, original, nil, &passwords{})
	stored := apply(t, original, first)
	d, err := Decide(Input{Object: withoutAnnotations(t, stored, v1alpha1.AnnotationStatus), Namespace: "team-a", Server: readyServer(), Secret: first.Secret, NewPassword: (&passwords{n: 100}).next})
	if err != nil {
		t.Fatal(err)
	}
	if d.Denied != "" || d.Outcome == OutcomeRotated || d.Outcome == OutcomeIssued {
		t.Fatalf("denied %q, outcome %s: want the credentials kept", d.Denied, d.Outcome)
	}
	if d.Secret != nil && string(d.Secret.Data[vmsecret.KeyPassword]) != string(first.Secret.Data[vmsecret.KeyPassword]) {
		t.Error("the password was replaced")
	}
}

// TestReCreatingAVMWhoseSecretIsGone: a VM created again from a manifest
// whose cloud-init volume reads its own credential Secret, once that
// Secret is gone (a cluster's garbage collector deletes it with the VM),
// is refused, saying where the owner's cloud-init must go: a VM admitted
// as it was would read a Secret without its user-data and not boot.
func TestReCreatingAVMWhoseSecretIsGone(t *testing.T) {
	stored, _ := injected(t, "inline-cloud-config")
	d, err := Decide(Input{Object: withoutAnnotations(t, stored, v1alpha1.AnnotationStatus), Namespace: "team-a", Server: readyServer(), NewPassword: (&passwords{}).next})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.Denied, "cloud-init volume cloudinitdisk reads Secret db-guestbackup, guestbackup's own for this VM, which does not exist any more") ||
		!strings.Contains(d.Denied, "put your own cloud-init back into volume cloudinitdisk") {
		t.Errorf("denial %q", d.Denied)
	}
	if d.Secret != nil || len(d.Patch) != 0 {
		t.Error("a Secret or a patch was written")
	}
}

// TestOwnersWhoMovedTheirCloudInitAreNotRefused: the Secret's copy of the
// owner's user-data guards only a VM that still counts on it.
func TestOwnersWhoMovedTheirCloudInitAreNotRefused(t *testing.T) {
	stored, secret := injected(t, "inline-cloud-config")
	old := withField(t, stored, "uid-1", "metadata", "uid")
	var m map[string]any
	if err := decodeJSON(old, &m); err != nil {
		t.Fatal(err)
	}
	volume := m["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"].([]any)[1].(map[string]any)
	delete(volume, "cloudInitNoCloud")
	volume["cloudInitNoCloud"] = map[string]any{"secretRef": map[string]any{"name": "db-own-cloud-init"}}
	toOwnSecret, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	newVM := withoutAnnotations(t, withField(t, readVM(t, "no-cloud-init"), "db", "metadata", "name"), v1alpha1.AnnotationStatus)
	for _, tt := range []struct {
		name     string
		obj, old []byte
	}{
		{"an update pointing the cloud-init volume at a Secret of the owner's", toOwnSecret, old},
		{"a new VM of a deleted VM's name that reads nothing of its Secret", newVM, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(Input{Object: tt.obj, OldObject: tt.old, Namespace: "team-a", Server: readyServer(), Secret: secret, NewPassword: (&passwords{}).next})
			if err != nil {
				t.Fatal(err)
			}
			if d.Denied != "" {
				t.Errorf("denied: %s", d.Denied)
			}
		})
	}
}
