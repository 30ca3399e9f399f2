package vmsecret

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

var main = types.NamespacedName{Namespace: "backup", Name: "main"}

// webSecret is web's Secret as the webhook writes it.
func webSecret(opts ...func(*corev1.Secret)) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: Name("web"), Namespace: "team-a", Labels: Labels("web", main)},
		Data:       map[string][]byte{KeyUsername: []byte("web@team-a"), KeyPassword: []byte("pw"), KeyGeneration: []byte("2")},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func controller(apiVersion, kind, name string, uid types.UID) func(*corev1.Secret) {
	return func(s *corev1.Secret) {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}}
	}
}

func TestValidateVMName(t *testing.T) {
	for _, tc := range []struct {
		vm, want string
	}{
		{vm: "web"},
		{vm: strings.Repeat("v", 63)},
		{vm: "db.primary"},
		{vm: strings.Repeat("v", 64), want: "its name (64 characters) cannot label its credential Secret (guestbackup.io/vm=<name>): must be no more than 63 characters"},
		{vm: "", want: "its credential Secret cannot be named -guestbackup"},
		{vm: "Web", want: "its credential Secret cannot be named Web-guestbackup"},
	} {
		err := ValidateVMName(tc.vm)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ValidateVMName(%q) = %v, want nil", tc.vm, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ValidateVMName(%q) = %v, want %q", tc.vm, err, tc.want)
		}
	}
}

func TestNotOurs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		secret *corev1.Secret
		want   string
	}{
		{"the webhook's Secret, not adopted yet", webSecret(), ""},
		{"adopted by the VM", webSecret(func(s *corev1.Secret) { s.OwnerReferences = []metav1.OwnerReference{OwnerReference("web", "uid")} }), ""},
		{"adopted by a previous VM of that name", webSecret(controller("kubevirt.io/v1", "VirtualMachine", "web", "old")), ""},
		{"owned, not controlled, by something else", webSecret(func(s *corev1.Secret) {
			s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "c"}}
		}), ""},
		{"unlabelled", webSecret(func(s *corev1.Secret) { s.Labels = nil }), "it is not labelled app.kubernetes.io/managed-by=guestbackup"},
		{"labelled for another VM", webSecret(func(s *corev1.Secret) { s.Labels[LabelVM] = "db" }), `its label guestbackup.io/vm is "db", not "web"`},
		{"controlled by a Deployment", webSecret(controller("apps/v1", "Deployment", "web", "d")), "it is controlled by Deployment web"},
		{"controlled by another VM", webSecret(controller("kubevirt.io/v1", "VirtualMachine", "db", "d")), "it is controlled by VirtualMachine db"},
	} {
		if got := NotOurs(tc.secret, "web"); got != tc.want {
			t.Errorf("%s: NotOurs = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestControlledBy(t *testing.T) {
	adopted := webSecret(func(s *corev1.Secret) { s.OwnerReferences = []metav1.OwnerReference{OwnerReference("web", "uid")} })
	ownerOnly := webSecret(func(s *corev1.Secret) {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web", UID: "uid"}}
	})
	for _, tc := range []struct {
		name   string
		secret *corev1.Secret
		vm     string
		uid    types.UID
		want   bool
	}{
		{"its adopting VM", adopted, "web", "uid", true},
		{"a VM of the same name and another UID", adopted, "web", "other", false},
		{"a VM of another name", adopted, "db", "uid", false},
		{"an empty UID", adopted, "web", "", false},
		{"an owner that is not its controller", ownerOnly, "web", "uid", false},
		{"no owner", webSecret(), "web", "uid", false},
	} {
		if got := ControlledBy(tc.secret, tc.vm, tc.uid); got != tc.want {
			t.Errorf("%s: ControlledBy = %t, want %t", tc.name, got, tc.want)
		}
	}
}

func TestAccessors(t *testing.T) {
	s := webSecret()
	if Identity(s) != "web@team-a" || VM(s) != "web" || Server(s) != main || !IsManaged(s) || !IsNamedFor(s) || !Selector().Matches(labelsOf(s)) {
		t.Errorf("accessors of %+v", s)
	}
	s.Data[KeyUsername] = []byte("db@team-b")
	if Identity(s) != "web@team-a" || GuestUsername(s) != "db@team-b" {
		t.Errorf("identity %q from facts, username key %q", Identity(s), GuestUsername(s))
	}
	if _, ok := PasswordHash(s); ok {
		t.Error("a hash without one stored")
	}
	SetPasswordHash(s, "hash")
	if h, ok := PasswordHash(s); !ok || h != "hash" {
		t.Errorf("PasswordHash = %q, %t after SetPasswordHash", h, ok)
	}
	s.Data[KeyGeneration] = []byte("3")
	if _, ok := PasswordHash(s); ok {
		t.Error("the hash of generation 2 is current for generation 3")
	}
	if g, ok := GenerationNumber(s); !ok || g != 3 {
		t.Errorf("GenerationNumber = %d, %t", g, ok)
	}
	SetAnnounced(s, "backup/main", "3")
	if server, generation := Announced(s); server != "backup/main" || generation != "3" {
		t.Errorf("Announced = %q, %q", server, generation)
	}
}

func labelsOf(s *corev1.Secret) labels.Set { return s.Labels }

func TestIsPayloadKey(t *testing.T) {
	for key, want := range map[string]bool{
		KeyUserData: true, KeyInstall: true, "ca.crt": true, "guestbackup.conf": true,
		KeyUsername: false, KeyPassword: false, KeyGeneration: false,
		KeyPasswordHash: false, KeyPasswordHashGeneration: false, KeyPreviousPasswordHash: false, KeyPreviousPasswordHashGeneration: false,
	} {
		if got := IsPayloadKey(key); got != want {
			t.Errorf("IsPayloadKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestRendered(t *testing.T) {
	s := webSecret()
	if endpoint, ca := Rendered(s); endpoint != "" || ca != "" {
		t.Fatalf("a Secret without a record: %q %q", endpoint, ca)
	}
	first := time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
	SetRendered(s, "https://main.backup.svc:51515", []byte("PEM"), first)
	endpoint, ca := Rendered(s)
	// sha256("PEM"): a fixed value, so that the webhook and the
	// controller of different releases agree on it.
	if endpoint != "https://main.backup.svc:51515" || ca != "384fb9a44fabe158be2757b9b8d8f67029f2280fcc1776ab2a53103e6f0c582d" {
		t.Errorf("Rendered = %q, %q", endpoint, ca)
	}
	for _, step := range []struct {
		name     string
		endpoint string
		ca       string
		want     time.Time
	}{
		{"rendered again with the same CA: since when it carries it stays", "https://other.backup.svc:51515", "PEM", first},
		{"rendered with another CA: since then", "https://other.backup.svc:51515", "NEXT", first.Add(2 * time.Hour)},
	} {
		SetRendered(s, step.endpoint, []byte(step.ca), first.Add(2*time.Hour))
		if at, ok := RenderedCAAt(s); !ok || !at.Equal(step.want) {
			t.Errorf("%s: RenderedCAAt = %v, %v; want %v", step.name, at, ok, step.want)
		}
	}
}
