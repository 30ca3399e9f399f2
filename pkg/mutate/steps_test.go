package mutate

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The steps of Decide, each on its own: what each takes and what it
// returns. Decide's golden and lifecycle tests prove them together.

var mainServer = types.NamespacedName{Namespace: "backup", Name: "main"}

// credentialSecret is VM web's Secret for server, of generation.
func credentialSecret(server types.NamespacedName, generation string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "web-guestbackup", Namespace: "team-a", Labels: vmsecret.Labels("web", server)},
		Data:       map[string][]byte{vmsecret.KeyPassword: []byte("kept-password"), vmsecret.KeyGeneration: []byte(generation)},
	}
}

func TestDecideLeavesTheReadVMAsItWas(t *testing.T) {
	stored, source := injected(t, "inline-cloud-config")
	for _, tc := range []struct {
		name string
		obj  []byte
	}{
		{"a copy, whose volumes are repointed", withoutAnnotations(t, withField(t, stored, "copy", "metadata", "name"), v1alpha1.AnnotationStatus)},
		{"a VM that names no namespace", withField(t, readVM(t, "no-cloud-init"), nil, "metadata", "namespace")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read, err := readAdmitted(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			before := read.vm.DeepCopy()
			d, err := Decide(Input{Object: tc.obj, read: read, Namespace: "team-a", Server: readyServer(),
				Sources: map[string]*corev1.Secret{source.Name: source}, NewPassword: (&passwords{}).next})
			if err != nil || d.Denied != "" || len(d.Patch) == 0 {
				t.Fatalf("denied %q, %d patches, %v: want the VM injected", d.Denied, len(d.Patch), err)
			}
			if !reflect.DeepEqual(read.vm, before) {
				t.Error("Decide changed the VM it was given")
			}
		})
	}
}

func TestInNamespace(t *testing.T) {
	for _, tc := range []struct {
		name, namespace, want string
	}{
		{"names none", "", "team-a"},
		{"names its own", "team-b", "team-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: tc.namespace}}
			if got := inNamespace(vm, "team-a"); got.Namespace != tc.want || got.Name != "web" {
				t.Errorf("namespace %q, want %q", got.Namespace, tc.want)
			}
			if vm.Namespace != tc.namespace {
				t.Error("the VM given was changed")
			}
		})
	}
}

func TestRepoint(t *testing.T) {
	ownPart := &corev1.LocalObjectReference{Name: "web-own"}
	source := &corev1.LocalObjectReference{Name: "src-guestbackup"}
	for _, tc := range []struct {
		name    string
		volume  kubevirtv1.VolumeSource
		want    kubevirtv1.VolumeSource
		wantOps []string
	}{
		{"a cloud-init volume's user-data",
			kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: source, NetworkData: "version: 2\n"}},
			kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "web-guestbackup"}, NetworkData: "version: 2\n"}},
			[]string{"replace /spec/template/spec/volumes/0/cloudInitNoCloud/secretRef/name"}},
		{"a secret disk, its label kept",
			kubevirtv1.VolumeSource{Secret: &kubevirtv1.SecretVolumeSource{SecretName: "src-guestbackup", VolumeLabel: "guestbackup"}},
			kubevirtv1.VolumeSource{Secret: &kubevirtv1.SecretVolumeSource{SecretName: "web-guestbackup", VolumeLabel: "guestbackup"}},
			[]string{"replace /spec/template/spec/volumes/0/secret/secretName"}},
		{"the owner's own Secret",
			kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: ownPart}},
			kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: ownPart}},
			nil},
		{"a config drive: the owner's, never rewritten",
			kubevirtv1.VolumeSource{CloudInitConfigDrive: &kubevirtv1.CloudInitConfigDriveSource{UserDataSecretRef: source}},
			kubevirtv1.VolumeSource{CloudInitConfigDrive: &kubevirtv1.CloudInitConfigDriveSource{UserDataSecretRef: source}},
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			volumes := []kubevirtv1.Volume{{Name: "v", VolumeSource: tc.volume}}
			before := slices.Clone(volumes)
			got, ops := repoint(volumes, "src-guestbackup", "web-guestbackup")
			if !reflect.DeepEqual(got[0].VolumeSource, tc.want) {
				t.Errorf("volume %+v, want %+v", got[0].VolumeSource, tc.want)
			}
			var gotOps []string
			for _, op := range ops {
				gotOps = append(gotOps, op.Operation+" "+op.Path)
			}
			if !slices.Equal(gotOps, tc.wantOps) {
				t.Errorf("patch %v, want %v", gotOps, tc.wantOps)
			}
			if !reflect.DeepEqual(volumes, before) || !reflect.DeepEqual(volumes[0].VolumeSource, tc.volume) {
				t.Error("the volumes given were changed")
			}
		})
	}
}

func TestWithVolumes(t *testing.T) {
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
		Spec:       kubevirtv1.VirtualMachineInstanceSpec{Volumes: []kubevirtv1.Volume{{Name: "old"}}},
	}}}
	for _, tc := range []struct {
		name    string
		volumes []kubevirtv1.Volume
	}{
		{"others", []kubevirtv1.Volume{{Name: "new"}}},
		{"none", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := withVolumes(vm, tc.volumes)
			if !reflect.DeepEqual(got.Spec.Template.Spec.Volumes, tc.volumes) || got.Name != "web" || got.Spec.Template.ObjectMeta.Labels["app"] != "web" {
				t.Errorf("got %+v", got)
			}
			if len(vm.Spec.Template.Spec.Volumes) != 1 || vm.Spec.Template.Spec.Volumes[0].Name != "old" {
				t.Error("the VM given was changed")
			}
		})
	}
}

func TestNotOptedIn(t *testing.T) {
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}, Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}}}
	for _, tc := range []struct {
		name        string
		pr          prior
		wantOutcome string
		wantDenial  string
	}{
		{"nothing injected", prior{}, OutcomeIgnored, ""},
		{"its own injection", prior{known: true, written: true, status: v1alpha1.InjectionStatus{Secret: "web-guestbackup", Volume: "guestbackup-cloudinit"}}, OutcomeRemoved, ""},
		{"a copy whose cloud-init is its source's", prior{known: true, status: v1alpha1.InjectionStatus{Secret: "src-guestbackup", Volume: "cloudinitdisk", MergedFrom: "userData"}}, OutcomeDenied, "carries annotation guestbackup.io/status of another VM's injection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := notOptedIn(vm, tc.pr, nil)
			if d.Outcome != tc.wantOutcome || !strings.Contains(d.Denied, tc.wantDenial) || (tc.wantDenial == "") != (d.Denied == "") {
				t.Errorf("outcome %s, denied %q; want %s, %q", d.Outcome, d.Denied, tc.wantOutcome, tc.wantDenial)
			}
		})
	}
}

func TestCredentialsFor(t *testing.T) {
	issued := func(pr prior) prior { pr.known, pr.status.Rotate = true, "1"; return pr }
	for _, tc := range []struct {
		name           string
		secret         *corev1.Secret
		rotate         string
		pr             prior
		wantPassword   string
		wantGeneration int64
		wantIssued     bool
		wantRotated    bool
	}{
		{"no Secret: the first", nil, "", prior{}, "new", 1, true, false},
		{"the Secret's", credentialSecret(mainServer, "3"), "1", issued(prior{}), "kept-password", 3, false, false},
		{"the Secret's, for a VM with no status", credentialSecret(mainServer, "3"), "1", prior{}, "kept-password", 3, false, false},
		{"a rotation asked for", credentialSecret(mainServer, "3"), "2", issued(prior{}), "new", 4, true, true},
		{"a Secret for another server", credentialSecret(types.NamespacedName{Namespace: "backup", Name: "other"}, "3"), "1", issued(prior{}), "new", 4, true, false},
		{"a Secret without a generation", credentialSecret(mainServer, ""), "1", issued(prior{}), "new", 1, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := credentialsFor(tc.secret, mainServer, tc.rotate, tc.pr, func() (string, error) { return "new", nil })
			if err != nil {
				t.Fatal(err)
			}
			want := credentials{password: tc.wantPassword, generation: tc.wantGeneration, issued: tc.wantIssued, rotated: tc.wantRotated}
			if got != want {
				t.Errorf("%+v, want %+v", got, want)
			}
		})
	}
	t.Run("no password to be had", func(t *testing.T) {
		if _, err := credentialsFor(nil, mainServer, "", prior{}, func() (string, error) { return "", errors.New("no entropy") }); err == nil || !strings.Contains(err.Error(), "no entropy") {
			t.Errorf("error %v, want the generator's", err)
		}
	})
}

func TestPlacementFor(t *testing.T) {
	stored, secret := injected(t, "inline-cloud-config")
	read, err := readAdmitted(stored)
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := vmsecret.ParseStatus(read.vm.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	part, err := cloudinit.UserPart(secret.Data[vmsecret.KeyUserData])
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := readAdmitted(readVM(t, "no-cloud-init"))
	if err != nil {
		t.Fatal(err)
	}
	injectedPrior := prior{status: st, known: true, written: true}
	for _, tc := range []struct {
		name        string
		vm          *kubevirtv1.VirtualMachine
		mode        string
		pr          prior
		secret      *corev1.Secret
		want        placement
		wantOps     int
		wantRefusal string
	}{
		{"where the status says, the owner's part read back", read.vm, "", injectedPrior, secret,
			placement{mode: st.Mode, volume: st.Volume, disk: st.Disk, mergedFrom: st.MergedFrom, userPart: part}, 0, ""},
		{"a copy's part read from its source", read.vm, "", prior{status: st, known: true, copied: true, source: secret}, nil,
			placement{mode: st.Mode, volume: st.Volume, disk: st.Disk, mergedFrom: st.MergedFrom, userPart: part}, 0, ""},
		{"a mode changed since", read.vm, v1alpha1.ModeDisk, injectedPrior, secret,
			placement{}, 0, "annotation guestbackup.io/mode changed from cloud-init to disk"},
		{"a Secret that lost the owner's part", read.vm, "", injectedPrior, credentialSecret(mainServer, "1"),
			placement{}, 0, "no longer holds the VM's own user-data"},
		{"chosen afresh", fresh.vm, "", prior{}, nil,
			placement{mode: v1alpha1.ModeCloudInit, volume: CloudInitVolume, disk: CloudInitVolume}, 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ops, refusal := placementFor(tc.vm, read.shape, tc.mode, tc.pr, tc.secret)
			if !strings.Contains(refusal, tc.wantRefusal) || (tc.wantRefusal == "") != (refusal == "") {
				t.Fatalf("refusal %q, want %q", refusal, tc.wantRefusal)
			}
			if !reflect.DeepEqual(got, tc.want) || len(ops) != tc.wantOps {
				t.Errorf("%+v with %d operations, want %+v with %d", got, len(ops), tc.want, tc.wantOps)
			}
		})
	}
}

func TestInjectionStatus(t *testing.T) {
	o := options{server: mainServer, user: "web@team-a", rotate: "1"}
	for _, tc := range []struct {
		name string
		p    placement
		want v1alpha1.InjectionStatus
	}{
		{"cloud-init, merged", placement{mode: v1alpha1.ModeCloudInit, volume: "cloudinitdisk", mergedFrom: "userData", userPart: []byte("#cloud-config\n")},
			v1alpha1.InjectionStatus{Mode: v1alpha1.ModeCloudInit, Server: "backup/main", Secret: "web-guestbackup", User: "web@team-a", Generation: 2, Rotate: "1", Volume: "cloudinitdisk", MergedFrom: "userData"}},
		{"disk", placement{mode: v1alpha1.ModeDisk, volume: DiskVolume, disk: DiskVolume, diskWhy: "it uses a cloudInitConfigDrive volume"},
			v1alpha1.InjectionStatus{Mode: v1alpha1.ModeDisk, Server: "backup/main", Secret: "web-guestbackup", User: "web@team-a", Generation: 2, Rotate: "1", Volume: DiskVolume, Disk: DiskVolume}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := injectionStatus("web", o, credentials{password: "pw", generation: 2}, tc.p); got != tc.want {
				t.Errorf("%+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestInjectionOutcome(t *testing.T) {
	for _, tc := range []struct {
		creds   credentials
		changed bool
		want    string
	}{
		{credentials{issued: true, rotated: true}, true, OutcomeRotated},
		{credentials{issued: true}, true, OutcomeIssued},
		{credentials{}, true, OutcomeUpdated},
		{credentials{}, false, OutcomeUnchanged},
	} {
		if got := injectionOutcome(tc.creds, tc.changed); got != tc.want {
			t.Errorf("injectionOutcome(%+v, changed %t) = %s, want %s", tc.creds, tc.changed, got, tc.want)
		}
	}
}

func TestIssuedMessage(t *testing.T) {
	o := options{server: mainServer, user: "web@team-a"}
	for _, tc := range []struct {
		name  string
		creds credentials
		p     placement
		want  string
	}{
		{"issued", credentials{generation: 1, issued: true}, placement{mode: v1alpha1.ModeCloudInit},
			"Issued Kopia credentials for web@team-a on BackupStorageLocationServer backup/main (generation 1, cloud-init mode, Secret web-guestbackup)"},
		{"rotated", credentials{generation: 4, issued: true, rotated: true}, placement{mode: v1alpha1.ModeDisk},
			"Rotated Kopia credentials for web@team-a on BackupStorageLocationServer backup/main (generation 4, disk mode, Secret web-guestbackup)"},
		{"disk mode it did not ask for", credentials{generation: 1, issued: true}, placement{mode: v1alpha1.ModeDisk, diskWhy: "it uses a cloudInitConfigDrive volume"},
			"Issued Kopia credentials for web@team-a on BackupStorageLocationServer backup/main (generation 1, disk mode because it uses a cloudInitConfigDrive volume: the guest needs guestbackup's disk unit (docs/guest.md, Disk mode), Secret web-guestbackup)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := issuedMessage("web", o, tc.creds, tc.p); got != tc.want {
				t.Errorf("%q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestPlacementRendered(t *testing.T) {
	part := []byte("#cloud-config\n")
	for _, tc := range []struct {
		name string
		p    placement
		want cloudinit.Placement
	}{
		{"merged", placement{mode: v1alpha1.ModeCloudInit, mergedFrom: "userData", userPart: part}, cloudinit.Placement{Mode: v1alpha1.ModeCloudInit, UserPart: part}},
		{"not merged", placement{mode: v1alpha1.ModeCloudInit, userPart: part}, cloudinit.Placement{Mode: v1alpha1.ModeCloudInit}},
		{"disk", placement{mode: v1alpha1.ModeDisk}, cloudinit.Placement{Mode: v1alpha1.ModeDisk}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.rendered(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%+v, want %+v", got, tc.want)
			}
		})
	}
}
