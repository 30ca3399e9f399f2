package vmsecret

import (
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

func TestRender(t *testing.T) {
	ca, err := pki.NewCA("main", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	server := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main"}}
	server.Status.Endpoint, server.Status.TLSCA = "https://main.backup.svc:51515", string(pki.EncodeCert(ca.Cert))
	guest := Guest{Username: "web@team-a", Password: "0123456789abcdef0123", Generation: 2, Paths: []string{"/srv"}}
	owner := []byte("#cloud-config\nruncmd: [echo owner]\n")
	withDiskFiles := func(s *corev1.Secret) { s.Data[KeyInstall] = []byte("an earlier disk rendering") }
	withHash := func(s *corev1.Secret) { SetPasswordHash(s, "hash") }
	for _, tc := range []struct {
		name   string
		secret *corev1.Secret
		p      cloudinit.Placement
	}{
		{"cloud-init into a Secret with credentials alone", webSecret(), cloudinit.Placement{Mode: v1alpha1.ModeCloudInit}},
		{"cloud-init merged with the owner's part", webSecret(), cloudinit.Placement{Mode: v1alpha1.ModeCloudInit, UserPart: owner}},
		{"disk mode", webSecret(), cloudinit.Placement{Mode: v1alpha1.ModeDisk}},
		{"cloud-init over an earlier disk rendering", webSecret(withDiskFiles), cloudinit.Placement{Mode: v1alpha1.ModeCloudInit}},
		{"keeping the controller's hash", webSecret(withHash), cloudinit.Placement{Mode: v1alpha1.ModeDisk}},
		{"into a Secret with no data yet", &corev1.Secret{}, cloudinit.Placement{Mode: v1alpha1.ModeCloudInit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload, err := cloudinit.Payload(cloudinit.Bootstrap{
				ServerURL: server.Status.Endpoint, CA: []byte(server.Status.TLSCA),
				Username: guest.Username, Password: guest.Password, Generation: guest.Generation, Paths: guest.Paths, Schedule: guest.Schedule,
			}, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			// Credentials and the controller's keys stay; the payload (a
			// disk's files name the credentials too) goes over them.
			want := maps.Clone(tc.secret.Data)
			maps.DeleteFunc(want, func(k string, _ []byte) bool { return IsPayloadKey(k) })
			if want == nil {
				want = map[string][]byte{}
			}
			maps.Copy(want, payload)
			s := tc.secret
			if err := Render(s, server, guest, tc.p, time.Now()); err != nil {
				t.Fatal(err)
			}
			if !maps.EqualFunc(s.Data, want, func(a, b []byte) bool { return string(a) == string(b) }) {
				t.Errorf("keys %v, want %v", slices.Sorted(maps.Keys(s.Data)), slices.Sorted(maps.Keys(want)))
			}
			if endpoint, caSum := Rendered(s); endpoint != server.Status.Endpoint || caSum != CASum([]byte(server.Status.TLSCA)) {
				t.Errorf("recorded as rendered with %s, %s", endpoint, caSum)
			}
			if RenderedClient(s) != clientdist.Digest(nil) {
				t.Errorf("recorded client %q for a server that publishes none", RenderedClient(s))
			}
		})
	}
	t.Run("a server that publishes no CA", func(t *testing.T) {
		none := server.DeepCopy()
		none.Status.TLSCA = ""
		s := webSecret()
		if err := Render(s, none, guest, cloudinit.Placement{Mode: v1alpha1.ModeCloudInit}, time.Now()); err == nil {
			t.Fatal("rendered a bootstrap that trusts no CA")
		}
		if !maps.EqualFunc(s.Data, webSecret().Data, func(a, b []byte) bool { return string(a) == string(b) }) || len(s.Annotations) != 0 {
			t.Errorf("a failed rendering changed the Secret: %v", s)
		}
	})
}

func TestParseStatus(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		absent      bool
		want        v1alpha1.InjectionStatus
		wantErr     bool
	}{
		{name: "none", absent: true},
		{name: "as the webhook writes it", value: `{"mode":"cloud-init","server":"backup/main","secret":"web-guestbackup","user":"web@team-a","generation":2,"volume":"cloudinitdisk","mergedFrom":"userData"}`,
			want: v1alpha1.InjectionStatus{Mode: v1alpha1.ModeCloudInit, Server: "backup/main", Secret: "web-guestbackup", User: "web@team-a", Generation: 2, Volume: "cloudinitdisk", MergedFrom: "userData"}},
		{name: "not JSON", value: "injected", wantErr: true},
		{name: "no Secret", value: `{"mode":"disk","volume":"guestbackup"}`, wantErr: true},
		{name: "no volume", value: `{"mode":"disk","secret":"web-guestbackup"}`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			annotations := map[string]string{v1alpha1.AnnotationServer: "backup/main"}
			if !tc.absent {
				annotations[v1alpha1.AnnotationStatus] = tc.value
			}
			st, ok, err := ParseStatus(annotations)
			if (err != nil) != tc.wantErr || ok != (!tc.absent && !tc.wantErr) {
				t.Fatalf("ok %t, error %v; want an error: %t", ok, err, tc.wantErr)
			}
			if ok && st != tc.want {
				t.Errorf("status %+v, want %+v", st, tc.want)
			}
		})
	}
}

func TestSecretsRead(t *testing.T) {
	ref := &corev1.LocalObjectReference{Name: "web-guestbackup"}
	other := &corev1.LocalObjectReference{Name: "web-own"}
	for _, tc := range []struct {
		name   string
		source kubevirtv1.VolumeSource
		want   []string
	}{
		{"cloud-init user-data", kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: ref}}, []string{"web-guestbackup"}},
		{"cloud-init user-data and network data", kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: other, NetworkDataSecretRef: ref}}, []string{"web-own", "web-guestbackup"}},
		{"a config drive", kubevirtv1.VolumeSource{CloudInitConfigDrive: &kubevirtv1.CloudInitConfigDriveSource{UserDataSecretRef: ref}}, []string{"web-guestbackup"}},
		{"a config drive's network data", kubevirtv1.VolumeSource{CloudInitConfigDrive: &kubevirtv1.CloudInitConfigDriveSource{UserData: "#cloud-config\n", NetworkDataSecretRef: ref}}, []string{"web-guestbackup"}},
		{"a secret disk", kubevirtv1.VolumeSource{Secret: &kubevirtv1.SecretVolumeSource{SecretName: "web-guestbackup"}}, []string{"web-guestbackup"}},
		{"sysprep", kubevirtv1.VolumeSource{Sysprep: &kubevirtv1.SysprepSource{Secret: ref}}, []string{"web-guestbackup"}},
		{"inline user-data", kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: "#cloud-config\n"}}, nil},
		{"a container disk", kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "web-guestbackup"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SecretsRead(tc.source); !slices.Equal(got, tc.want) {
				t.Errorf("SecretsRead = %v, want %v", got, tc.want)
			}
		})
	}
}
