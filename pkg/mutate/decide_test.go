package mutate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/golden"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// goldenDir holds a directory per golden case: the VM (vm.yaml, the input)
// and what Decide makes of it (patch.json, secret.yaml); -update rewrites them.
const goldenDir = "testdata/golden"

const testEndpoint = "https://main.backup.svc:51515"

// testCA is a fixed CA certificate (testdata/ca.crt), so goldens are stable.
var testCA = func() string {
	ca, err := os.ReadFile(filepath.Join("testdata", "ca.crt"))
	if err != nil {
		panic(err)
	}
	return string(ca)
}()

func readyServer() Server {
	return Server{NamespaceAllowed: true, BSLS: &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"},
		Status: v1alpha1.BackupStorageLocationServerStatus{
			Endpoint: testEndpoint, TLSCA: testCA,
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready"}},
		},
	}}
}

// passwords hands out predictable passwords, so golden files are stable.
type passwords struct{ n int }

func (p *passwords) next() (string, error) {
	p.n++
	return fmt.Sprintf("test-password-%04d-not-random", p.n), nil
}

func decide(t *testing.T, obj []byte, secret *corev1.Secret, pw *passwords) Decision {
	t.Helper()
	d, err := Decide(Input{Object: obj, Namespace: "team-a", Server: readyServer(), Secret: secret, NewPassword: pw.next})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// apply applies a decision's patch the way the API server does.
func apply(t testing.TB, obj []byte, d Decision) []byte {
	t.Helper()
	if len(d.Patch) == 0 {
		return obj
	}
	out, err := testbed.ApplyPatch(obj, d.Patch)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// readVM reads golden case name's VirtualMachine (testdata/golden/<name>/vm.yaml) as JSON.
func readVM(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(goldenDir, name, "vm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// secretYAML renders a Secret's data readably: the payload is text.
func secretYAML(t *testing.T, s *corev1.Secret) []byte {
	t.Helper()
	data := map[string]string{}
	for k, v := range s.Data {
		data[k] = string(v)
	}
	out, err := yaml.Marshal(map[string]any{"name": s.Name, "namespace": s.Namespace, "labels": s.Labels, "data": data})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// withAnnotation is obj with annotation key set to value.
func withAnnotation(t *testing.T, obj []byte, key, value string) []byte {
	t.Helper()
	var m map[string]any
	if err := decodeJSON(obj, &m); err != nil {
		t.Fatal(err)
	}
	m["metadata"].(map[string]any)["annotations"].(map[string]any)[key] = value
	out, _ := json.Marshal(m)
	return out
}

// withoutServer is obj with the opt-in annotation removed.
func withoutServer(t *testing.T, obj []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := decodeJSON(obj, &m); err != nil {
		t.Fatal(err)
	}
	delete(m["metadata"].(map[string]any)["annotations"].(map[string]any), v1alpha1.AnnotationServer)
	out, _ := json.Marshal(m)
	return out
}

// decodeJSON decodes keeping numbers exact: the fixture has uint64s.
func decodeJSON(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	return d.Decode(v)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if decodeJSON(a, &x) != nil || decodeJSON(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

var serialPattern = regexp.MustCompile(`^[A-Za-z0-9_.+-]{1,20}$`)

// checkKubeVirtRules checks what KubeVirt's own webhooks would, which
// envtest does not run: one cloud-init volume at most (KubeVirt ignores the
// others), one source per volume we add, valid disk serials, inline
// user-data within 2048 bytes, every disk backed by a volume.
func checkKubeVirtRules(t *testing.T, obj []byte) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := json.Unmarshal(obj, &vm); err != nil {
		t.Fatal(err)
	}
	spec := vm.Spec.Template.Spec
	cloudInit := 0
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
		if v.CloudInitNoCloud != nil || v.CloudInitConfigDrive != nil {
			cloudInit++
		}
		if nc := v.CloudInitNoCloud; nc != nil && len(nc.UserData) > 2048 {
			t.Errorf("volume %s: inline userData of %d bytes exceeds KubeVirt's 2048", v.Name, len(nc.UserData))
		}
	}
	if cloudInit > 1 {
		t.Errorf("%d cloud-init volumes: KubeVirt uses only the first", cloudInit)
	}
	for _, d := range spec.Domain.Devices.Disks {
		if !volumes[d.Name] {
			t.Errorf("disk %s has no volume", d.Name)
		}
		if d.Serial != "" && !serialPattern.MatchString(d.Serial) {
			t.Errorf("disk %s: serial %q is not valid for KubeVirt", d.Name, d.Serial)
		}
	}
}

func TestDecideGolden(t *testing.T) {
	for _, name := range golden.Cases(t, goldenDir) {
		t.Run(name, func(t *testing.T) {
			pw := &passwords{}
			original := readVM(t, name)
			d := decide(t, original, nil, pw)
			if d.Denied != "" {
				t.Fatalf("denied: %s", d.Denied)
			}
			patch, _ := json.MarshalIndent(d.Patch, "", "  ")
			golden.Check(t, filepath.Join(goldenDir, name), map[string][]byte{
				"patch.json":  append(patch, '\n'),
				"secret.yaml": secretYAML(t, d.Secret),
			}, "vm.yaml")
			// A VM being created has no UID: its Event waits in the Secret
			// for the controller to record it once the VM exists.
			if issued := d.Secret.Annotations[vmsecret.AnnotationIssuedEvent]; len(d.Events) != 0 || !strings.HasPrefix(issued, "Issued Kopia credentials for ") || strings.Contains(issued, "test-password") {
				t.Errorf("events: %+v, issued-event %q", d.Events, issued)
			}
			mutated := apply(t, original, d)
			checkKubeVirtRules(t, mutated)

			t.Run("admitting the result again changes nothing", func(t *testing.T) {
				stored := d.Secret.DeepCopy()
				// The controller's hasher adds its keys; they stay.
				stored.Data[v1alpha1.SecretKeyPasswordHash] = []byte("hash")
				stored.Data[v1alpha1.SecretKeyPasswordHashGeneration] = []byte("1")
				again := decide(t, mutated, stored, pw)
				if again.Denied != "" || len(again.Patch) != 0 || again.Secret != nil || len(again.Events) != 0 {
					t.Errorf("second admission: %+v", again)
				}
			})

			t.Run("opting out gives the VM back as it was", func(t *testing.T) {
				out := decide(t, withoutServer(t, mutated), d.Secret, pw)
				if out.Denied != "" || out.Secret != nil {
					t.Fatalf("opt-out: %+v", out)
				}
				restored := apply(t, withoutServer(t, mutated), out)
				if !jsonEqual(restored, withoutServer(t, original)) {
					t.Errorf("after opting out:\n%s\nwant\n%s", restored, withoutServer(t, original))
				}
			})
		})
	}
}

func TestMergedPayloadKeepsTheVMsUserData(t *testing.T) {
	original := readVM(t, "inline-cloud-config")
	var vm kubevirtv1.VirtualMachine
	if err := json.Unmarshal(original, &vm); err != nil {
		t.Fatal(err)
	}
	d := decide(t, original, nil, &passwords{})
	part, err := cloudinit.UserPart(d.Secret.Data[v1alpha1.SecretKeyUserData])
	if err != nil {
		t.Fatal(err)
	}
	if string(part) != vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud.UserData {
		t.Errorf("the VM's own user-data changed in the Secret:\n%q", part)
	}
	var mutated kubevirtv1.VirtualMachine
	if err := json.Unmarshal(apply(t, original, d), &mutated); err != nil {
		t.Fatal(err)
	}
	if nc := mutated.Spec.Template.Spec.Volumes[1].CloudInitNoCloud; nc.NetworkData == "" || nc.UserData != "" || nc.UserDataSecretRef.Name != "db-guestbackup" {
		t.Errorf("want userData moved to the Secret and networkData kept: %+v", nc)
	}
}

func TestRotation(t *testing.T) {
	pw := &passwords{}
	original := readVM(t, "no-cloud-init")
	first := decide(t, original, nil, pw)
	// An update: the VM has its UID.
	rotating := withField(t, withAnnotation(t, apply(t, original, first), v1alpha1.AnnotationRotate, "2026-11-23"), "uid-1", "metadata", "uid")

	d := decide(t, rotating, first.Secret, pw)
	if d.Denied != "" || d.Secret == nil {
		t.Fatalf("rotation: %+v", d)
	}
	if string(d.Secret.Data[v1alpha1.SecretKeyGeneration]) != "2" || bytes.Equal(d.Secret.Data[v1alpha1.SecretKeyPassword], first.Secret.Data[v1alpha1.SecretKeyPassword]) {
		t.Errorf("want generation 2 and a new password, got generation %s", d.Secret.Data[v1alpha1.SecretKeyGeneration])
	}
	if len(d.Patch) != 1 || d.Patch[0].Operation != "replace" || !strings.Contains(fmt.Sprint(d.Patch[0].Value), `"generation":2`) {
		t.Errorf("want only the status annotation replaced, got %+v", d.Patch)
	}
	if len(d.Events) != 1 || !strings.HasPrefix(d.Events[0].Message, "Rotated Kopia credentials for web@team-a") {
		t.Errorf("events: %+v", d.Events)
	}
	again := decide(t, apply(t, rotating, d), d.Secret, pw)
	if len(again.Patch) != 0 || again.Secret != nil {
		t.Errorf("a rotation is not repeated on re-admission: %+v", again)
	}
}

func TestChangedPathsRewriteOnlyTheSecret(t *testing.T) {
	pw := &passwords{}
	original := readVM(t, "no-cloud-init")
	first := decide(t, original, nil, pw)
	changed := withAnnotation(t, apply(t, original, first), v1alpha1.AnnotationPaths, "/var/lib/app")
	d := decide(t, changed, first.Secret, pw)
	if len(d.Patch) != 0 || d.Secret == nil || !bytes.Contains(d.Secret.Data[v1alpha1.SecretKeyUserData], []byte("/var/lib/app")) {
		t.Errorf("want the same VM and a Secret with the new paths: patch %+v", d.Patch)
	}
	if !bytes.Equal(d.Secret.Data[v1alpha1.SecretKeyPassword], first.Secret.Data[v1alpha1.SecretKeyPassword]) || len(d.Events) != 0 {
		t.Error("new paths issued new credentials")
	}
}

// TestSecretRecordsWhatItWasRenderedWith: the controller renders a payload
// again when the server publishes another endpoint or CA than the Secret
// records (pkg/credentials.BootstrapReconciler), so the webhook records
// both, and an admission that renders the same bytes for another record
// still writes it.
func TestSecretRecordsWhatItWasRenderedWith(t *testing.T) {
	pw := &passwords{}
	original := readVM(t, "no-cloud-init")
	first := decide(t, original, nil, pw)
	if endpoint, ca := vmsecret.Rendered(first.Secret); endpoint != testEndpoint || ca != vmsecret.CASum([]byte(testCA)) {
		t.Fatalf("Secret records %q, %q; want the server's endpoint and its CA's SHA-256", endpoint, ca)
	}
	stored := apply(t, original, first)
	if again := decide(t, stored, first.Secret, pw); again.Secret != nil {
		t.Error("a re-admission rewrote a Secret that records what it holds")
	}
	unrecorded := first.Secret.DeepCopy()
	delete(unrecorded.Annotations, vmsecret.AnnotationRenderedCA)
	again := decide(t, stored, unrecorded, pw)
	if again.Secret == nil || again.Secret.Annotations[vmsecret.AnnotationRenderedCA] != vmsecret.CASum([]byte(testCA)) {
		t.Error("a re-admission left a Secret without its record")
	}
}

func TestDenials(t *testing.T) {
	base := readVM(t, "no-cloud-init")
	set := func(key, value string) []byte {
		if key != "name" {
			return withAnnotation(t, base, key, value)
		}
		var m map[string]any
		_ = json.Unmarshal(base, &m)
		m["metadata"].(map[string]any)["name"] = value
		out, _ := json.Marshal(m)
		return out
	}
	notReady := readyServer()
	notReady.BSLS.Status.Endpoint = ""
	notReady.BSLS.Status.Conditions[0] = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "ServerAvailable", Message: "Not True: ServerAvailable"}
	forcedCloudInit := withAnnotation(t, readVM(t, "secret-ref"), v1alpha1.AnnotationMode, "cloud-init")

	// Secrets named web-guestbackup that are not guestbackup's for web.
	foreign := func(mutate func(*corev1.Secret)) *corev1.Secret {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "web-guestbackup", Namespace: "team-a", Labels: vmsecret.Labels("web", types.NamespacedName{Namespace: "backup", Name: "main"})},
			Data:       map[string][]byte{"token": []byte("the tenant's own data")},
		}
		mutate(s)
		return s
	}
	controlledBy := func(apiVersion, kind, name string) func(*corev1.Secret) {
		return func(s *corev1.Secret) {
			s.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: "other-uid", Controller: ptr.To(true)}}
		}
	}

	tests := []struct {
		name   string
		obj    []byte
		server Server
		secret *corev1.Secret
		want   string
	}{
		{"a malformed server reference", set(v1alpha1.AnnotationServer, "main"), readyServer(), nil, "annotation guestbackup.io/server=\"main\": want <namespace>/<name>"},
		{"a server that does not exist", base, Server{}, nil, "BackupStorageLocationServer backup/main named by annotation guestbackup.io/server does not exist"},
		{"a namespace the server does not admit", base, Server{BSLS: readyServer().BSLS}, nil, "does not admit VMs of namespace team-a"},
		{"a server that has not published its endpoint", base, notReady, nil, "BackupStorageLocationServer backup/main has not published its endpoint and CA certificate yet (Ready=False ServerAvailable: Not True: ServerAvailable), and the guest needs both: see `kubectl describe bsls -n backup main`, and retry once status.endpoint and status.tlsCA are set"},
		{"an unknown mode", set(v1alpha1.AnnotationMode, "usb"), readyServer(), nil, `annotation guestbackup.io/mode="usb": want cloud-init or disk`},
		{"a relative path", set(v1alpha1.AnnotationPaths, "etc"), readyServer(), nil, `annotation guestbackup.io/paths: path "etc" is not an absolute path`},
		{"a schedule that breaks out of the timer", set(v1alpha1.AnnotationSchedule, "daily\nExecStart=/bin/sh"), readyServer(), nil, "is not a systemd calendar expression"},
		{"a VM name that is no Kopia identity", set("name", "Web"), readyServer(), nil, "VirtualMachine team-a/Web cannot get guestbackup credentials: its credential Secret cannot be named Web-guestbackup"},
		{"a VM name too long to label its Secret", set("name", strings.Repeat("v", 64)), readyServer(), nil,
			"VirtualMachine team-a/" + strings.Repeat("v", 64) + " cannot get guestbackup credentials: its name (64 characters) cannot label its credential Secret (guestbackup.io/vm=<name>): must be no more than 63 characters"},
		{"an unrelated Secret under the VM's Secret name", base, readyServer(), foreign(func(s *corev1.Secret) { s.Labels = map[string]string{"app": "web"} }),
			"Secret team-a/web-guestbackup already exists and is not guestbackup's credential Secret for VirtualMachine web (it is not labelled app.kubernetes.io/managed-by=guestbackup): guestbackup keeps this VM's credentials in a Secret of that name and never overwrites another; rename or delete that Secret"},
		{"guestbackup's label on a Secret made for another VM", base, readyServer(), foreign(func(s *corev1.Secret) { s.Labels[v1alpha1.LabelVM] = "db" }),
			`(its label guestbackup.io/vm is "db", not "web")`},
		{"a Secret another object controls", base, readyServer(), foreign(controlledBy("apps/v1", "Deployment", "web")),
			"(it is controlled by Deployment web)"},
		{"a Secret another VirtualMachine controls", base, readyServer(), foreign(controlledBy("kubevirt.io/v1", "VirtualMachine", "db")),
			"(it is controlled by VirtualMachine db)"},
		{"cloud-init forced where it cannot merge", forcedCloudInit, readyServer(), nil, "annotation guestbackup.io/mode=cloud-init cannot be honoured: its cloud-init user-data is in Secret app-owner-userdata"},
		{"a status annotation someone edited", set(v1alpha1.AnnotationStatus, "{}"), readyServer(), nil, "annotation guestbackup.io/status is not what guestbackup wrote"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.secret.DeepCopy()
			d, err := Decide(Input{Object: tt.obj, Namespace: "team-a", Server: tt.server, Secret: tt.secret, NewPassword: (&passwords{}).next})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(d.Denied, tt.want) {
				t.Errorf("denial %q, want it to contain %q", d.Denied, tt.want)
			}
			if d.Secret != nil || len(d.Patch) != 0 {
				t.Error("a denial wrote something")
			}
			if !equality.Semantic.DeepEqual(tt.secret, before) {
				t.Error("Decide changed the existing Secret")
			}
			if len(d.Events) != 1 || d.Events[0].Reason != ReasonInjectionRefused || d.Events[0].Type != corev1.EventTypeWarning {
				t.Errorf("events: %+v", d.Events)
			}
		})
	}
}

// TestSecretOfThisVMIsRewritten: the Secrets the webhook may write are
// guestbackup's for this VM, adopted or not yet, including one a previous
// VM of the same name controlled (deleted and created again: the same
// identity, which the controller adopts for the new VM). An update keeps
// the Secret's owner references. A CREATE drops a reference to the VM
// that was deleted, for which a garbage collector would delete the Secret
// and the owner's user-data in it.
func TestSecretOfThisVMIsRewritten(t *testing.T) {
	base := readVM(t, "no-cloud-init")
	first := decide(t, base, nil, &passwords{})
	previous := vmsecret.OwnerReference("web", "uid-0")
	this := vmsecret.OwnerReference("web", "uid-1")
	other := metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Keeper", Name: "k", UID: "uid-k"}
	for _, tt := range []struct {
		name string
		uid  string // the admitted and stored VM's; "" on CREATE
		refs []metav1.OwnerReference
		want []metav1.OwnerReference
	}{
		{name: "not adopted yet, on create", want: nil},
		{name: "adopted by this VM, on update", uid: "uid-1", refs: []metav1.OwnerReference{this}, want: []metav1.OwnerReference{this}},
		{name: "adopted by a previous VM, on update", uid: "uid-1", refs: []metav1.OwnerReference{previous}, want: []metav1.OwnerReference{previous}},
		{name: "adopted by a previous VM, on create", refs: []metav1.OwnerReference{previous, other}, want: []metav1.OwnerReference{other}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stored := first.Secret.DeepCopy()
			stored.OwnerReferences = tt.refs
			obj := withAnnotation(t, base, v1alpha1.AnnotationPaths, "/var/lib/app")
			var old []byte
			if tt.uid != "" {
				obj = withField(t, obj, tt.uid, "metadata", "uid")
				old = withField(t, apply(t, base, first), tt.uid, "metadata", "uid")
			}
			d, err := Decide(Input{Object: obj, OldObject: old, Namespace: "team-a", Server: readyServer(), Secret: stored, NewPassword: (&passwords{}).next})
			if err != nil {
				t.Fatal(err)
			}
			if d.Denied != "" || d.Secret == nil {
				t.Fatalf("denied %q, Secret %v: want the Secret rewritten", d.Denied, d.Secret != nil)
			}
			if !equality.Semantic.DeepEqual(d.Secret.OwnerReferences, tt.want) {
				t.Errorf("owner references %v, want %v", d.Secret.OwnerReferences, tt.want)
			}
		})
	}
}

// TestCreateOverAnExistingVMChangesNothing: a CREATE for a name a VM
// already has is refused by the API server after admission; its
// admission must neither rotate nor relabel that VM's credentials.
func TestCreateOverAnExistingVMChangesNothing(t *testing.T) {
	base := readVM(t, "no-cloud-init")
	stored := decide(t, base, nil, &passwords{}).Secret
	stored.OwnerReferences = []metav1.OwnerReference{vmsecret.OwnerReference("web", "uid-1")}
	before := stored.DeepCopy()
	d, err := Decide(Input{Object: base, Namespace: "team-a", Server: readyServer(), Secret: stored, AlreadyExists: true, NewPassword: (&passwords{}).next})
	if err != nil {
		t.Fatal(err)
	}
	want := "VirtualMachine team-a/web already exists: a CREATE cannot replace it, and guestbackup leaves its credentials as they are; change the existing VM instead"
	if d.Denied != want {
		t.Errorf("denial %q, want %q", d.Denied, want)
	}
	if d.Secret != nil || len(d.Patch) != 0 || !equality.Semantic.DeepEqual(stored, before) {
		t.Error("admission of a CREATE the API server refuses changed something")
	}
}

// TestLongestVMName: a name of 63 characters, the most a label value
// holds, gets its credentials.
func TestLongestVMName(t *testing.T) {
	var m map[string]any
	_ = json.Unmarshal(readVM(t, "no-cloud-init"), &m)
	name := strings.Repeat("v", 63)
	m["metadata"].(map[string]any)["name"] = name
	obj, _ := json.Marshal(m)
	d := decide(t, obj, nil, &passwords{})
	if d.Denied != "" || d.Secret == nil || d.Secret.Name != name+"-guestbackup" || d.Secret.Labels[v1alpha1.LabelVM] != name {
		t.Errorf("a 63-character name: denied %q, Secret %+v", d.Denied, d.Secret)
	}
}

func TestPlainVMIsLeftAlone(t *testing.T) {
	d := decide(t, withoutServer(t, readVM(t, "no-cloud-init")), nil, &passwords{})
	if d.Denied != "" || len(d.Patch) != 0 || d.Secret != nil || len(d.Events) != 0 {
		t.Errorf("a VM that never opted in: %+v", d)
	}
}

// kubevirtFixture is kubevirt.io/api's fully populated VirtualMachine, read
// from the module cache: every field the API has, set, but for the two that
// would keep guestbackup from injecting it at all: its deletionTimestamp (a
// VM being deleted is admitted untouched) and the sysprep source of its one
// volume (a Windows guest reads no cloud-init and is denied). With them, every
// admission of it was "ignored", so neither the specs nor the benchmark
// ever injected a fully populated VM.
func kubevirtFixture(t testing.TB) []byte {
	t.Helper()
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "kubevirt.io/api").Output()
	if err != nil || len(bytes.TrimSpace(dir)) == 0 {
		t.Fatalf("locate kubevirt.io/api in the module cache (go mod download fetches it): %v", err)
	}
	data, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "apitesting", "testdata", "HEAD", "kubevirt.io.v1.VirtualMachine.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := decodeJSON(data, &m); err != nil {
		t.Fatal(err)
	}
	meta := m["metadata"].(map[string]any)
	meta["name"], meta["namespace"] = "fixture", "team-a"
	meta["annotations"].(map[string]any)[v1alpha1.AnnotationServer] = "backup/main"
	delete(meta, "deletionTimestamp")
	delete(meta, "deletionGracePeriodSeconds")
	volumes := m["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"].([]any)
	for _, v := range volumes {
		delete(v.(map[string]any), "sysprep")
	}
	out, _ := json.Marshal(m)
	return out
}

func TestEveryFieldOfAFullyPopulatedVMSurvives(t *testing.T) {
	original := kubevirtFixture(t)
	pw := &passwords{}
	d := decide(t, original, nil, pw)
	if d.Denied != "" {
		t.Fatalf("denied: %s", d.Denied)
	}
	if d.Outcome != OutcomeIssued || len(d.Patch) == 0 || d.Secret == nil {
		t.Fatalf("the fully populated VM was not injected: outcome %s, %d patch operations, Secret %v", d.Outcome, len(d.Patch), d.Secret != nil)
	}
	for _, op := range d.Patch {
		if op.Operation == "remove" || !(strings.HasPrefix(op.Path, "/spec/template/spec/volumes") || strings.HasPrefix(op.Path, "/spec/template/spec/domain/devices/disks") || op.Path == "/metadata/annotations/guestbackup.io~1status") {
			t.Errorf("patch touches %s %s", op.Operation, op.Path)
		}
	}
	mutated := apply(t, original, d)
	if again := decide(t, mutated, d.Secret, pw); len(again.Patch) != 0 || again.Secret != nil {
		t.Errorf("second admission: %+v", again)
	}
	out := decide(t, withoutServer(t, mutated), d.Secret, pw)
	if restored := apply(t, withoutServer(t, mutated), out); !jsonEqual(restored, withoutServer(t, original)) {
		t.Error("opting out did not give the fully populated VM back unchanged")
	}
}
