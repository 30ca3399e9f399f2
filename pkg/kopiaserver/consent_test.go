package kopiaserver

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

func TestVeleroConsents(t *testing.T) {
	for _, tt := range []struct {
		name        string
		annotations map[string]string
		want        bool
	}{
		{"no annotations", nil, false},
		{"another annotation", map[string]string{"guestbackup.io/other": "x/thief"}, false},
		{"empty list", map[string]string{v1alpha1.AnnotationAllowedServers: ""}, false},
		{"exactly this server", map[string]string{v1alpha1.AnnotationAllowedServers: "x/thief"}, true},
		{"in a list, with spaces", map[string]string{v1alpha1.AnnotationAllowedServers: "a/b , x/thief,c/d"}, true},
		{"another server of the namespace", map[string]string{v1alpha1.AnnotationAllowedServers: "x/other"}, false},
		{"the name in another namespace", map[string]string{v1alpha1.AnnotationAllowedServers: "y/thief"}, false},
		{"a pattern is no consent", map[string]string{v1alpha1.AnnotationAllowedServers: "x/*"}, false},
		{"a wildcard is no consent", map[string]string{v1alpha1.AnnotationAllowedServers: "*"}, false},
		{"a prefix is no consent", map[string]string{v1alpha1.AnnotationAllowedServers: "x/thief-2"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := VeleroConsents(tt.annotations, "x", "thief"); got != tt.want {
				t.Errorf("VeleroConsents(%v) = %t, want %t", tt.annotations, got, tt.want)
			}
		})
	}
}

func TestVeleroConsentRequiredSaysWhatToSetWhere(t *testing.T) {
	b := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "thief"}}
	p := veleroConsentRequired(&v1alpha1.BackupStorageLocationRef{Namespace: "velero", Name: "default"}, b)
	if p.Reason != ReasonVeleroConsentRequired {
		t.Errorf("reason %s", p.Reason)
	}
	for _, want := range []string{"Velero BackupStorageLocation velero/default", "adds x/thief", "annotation guestbackup.io/allowed-servers", "kubectl -n velero annotate backupstoragelocation.velero.io default guestbackup.io/allowed-servers=x/thief"} {
		if !strings.Contains(p.Message, want) {
			t.Errorf("message %q lacks %q", p.Message, want)
		}
	}
}

func TestDecidePassword(t *testing.T) {
	opened := metav1.NewTime(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))
	bsls := func(mutate func(*v1alpha1.BackupStorageLocationServer)) *v1alpha1.BackupStorageLocationServer {
		b := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main"},
			Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
		}
		if mutate != nil {
			mutate(b)
		}
		return b
	}
	withRef := func(b *v1alpha1.BackupStorageLocationServer) {
		b.Spec.Repository.PasswordSecretRef = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "mine"}, Key: "pw"}
	}
	wasOpened := func(b *v1alpha1.BackupStorageLocationServer) { b.Status.RepositoryOpened = &opened }
	for _, tt := range []struct {
		name          string
		b             *v1alpha1.BackupStorageLocationServer
		found, hasKey bool
		wantGenerate  bool
		wantReason    string
		wantMessage   []string
	}{
		{name: "a new BSLS: generate", b: bsls(nil), wantGenerate: true},
		{name: "the password is there", b: bsls(wasOpened), found: true, hasKey: true},
		{name: "the Secret lacks its key", b: bsls(nil), found: true, wantReason: ReasonPasswordSecretInvalid, wantMessage: []string{"Secret main-repository has no key password"}},
		{name: "the admin's Secret is missing", b: bsls(withRef), wantReason: ReasonPasswordSecretInvalid, wantMessage: []string{"Secret mine not found in namespace backup"}},
		{name: "the admin's Secret is missing, after the repository was opened", b: bsls(func(b *v1alpha1.BackupStorageLocationServer) { withRef(b); wasOpened(b) }), wantReason: ReasonPasswordSecretInvalid},
		{
			name: "the generated Secret is gone after the repository was opened: lost, never replaced", b: bsls(wasOpened), wantReason: ReasonRepositoryPasswordLost,
			wantMessage: []string{"Secret main-repository", "PersistentVolumeClaim main-repository", "on 2025-01-02T03:04:05Z", "Restore Secret main-repository (key password) in namespace backup"},
		},
		{
			name: "a status from before status.repositoryOpened, RepositoryReady True: lost", wantReason: ReasonRepositoryPasswordLost,
			b: bsls(func(b *v1alpha1.BackupStorageLocationServer) {
				meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionRepositoryReady, Status: metav1.ConditionTrue, Reason: ReasonRepositoryOpened})
			}),
		},
		{
			name: "opened once, unready now: still lost", wantReason: ReasonRepositoryPasswordLost,
			b: bsls(func(b *v1alpha1.BackupStorageLocationServer) {
				wasOpened(b)
				meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionRepositoryReady, Status: metav1.ConditionFalse, Reason: ReasonRepositoryPasswordLost})
			}),
		},
		{
			name: "never opened, a failing init: generate", wantGenerate: true,
			b: bsls(func(b *v1alpha1.BackupStorageLocationServer) {
				meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionRepositoryReady, Status: metav1.ConditionFalse, Reason: ReasonRepositoryInitFailed})
			}),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			generate, p := decidePassword(tt.b, tt.found, tt.hasKey)
			if generate != tt.wantGenerate {
				t.Errorf("generate = %t, want %t", generate, tt.wantGenerate)
			}
			if generate && p != nil {
				t.Errorf("generate with a problem: %+v", p)
			}
			switch {
			case tt.wantReason == "" && p != nil:
				t.Errorf("problem %+v, want none", p)
			case tt.wantReason != "" && (p == nil || p.Reason != tt.wantReason):
				t.Errorf("problem %+v, want reason %s", p, tt.wantReason)
			}
			for _, want := range tt.wantMessage {
				if p == nil || !strings.Contains(p.Message, want) {
					t.Errorf("message %+v lacks %q", p, want)
				}
			}
		})
	}
}

func TestWithPasswordHint(t *testing.T) {
	fresh := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: "main"}}
	opened := fresh.DeepCopy()
	opened.Status.RepositoryOpened = &metav1.Time{Time: time.Now()}
	admins := fresh.DeepCopy()
	admins.Spec.Repository.PasswordSecretRef = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "mine"}, Key: "pw"}
	wrongPassword := &problem{ReasonRepositoryInitFailed, "pod main-server-1: the init container, which opens the repository, exited with code 1: invalid repository password"}
	unreachable := &problem{ReasonRepositoryInitFailed, "pod main-server-1: exited with code 1: dial tcp: connection refused"}
	for _, tt := range []struct {
		name string
		b    *v1alpha1.BackupStorageLocationServer
		p    *problem
		hint bool
	}{
		{"a new cluster on old storage with a generated password", fresh, wrongPassword, true},
		{"a repository this BSLS opened before: its own password changed", opened, wrongPassword, false},
		{"the admin's password Secret", admins, wrongPassword, false},
		{"another failure", fresh, unreachable, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := withPasswordHint(tt.b, tt.p)
			if got.Reason != tt.p.Reason || !strings.HasPrefix(got.Message, tt.p.Message) {
				t.Fatalf("the init failure itself changed: %+v", got)
			}
			hinted := strings.Contains(got.Message, "replace Secret main-repository (key password) with the one backed up from the old cluster")
			if hinted != tt.hint {
				t.Errorf("hint = %t, want %t: %s", hinted, tt.hint, got.Message)
			}
		})
	}
}

func TestChooseTLS(t *testing.T) {
	plain := &v1alpha1.BackupStorageLocationServer{}
	secret := &v1alpha1.BackupStorageLocationServer{Spec: v1alpha1.BackupStorageLocationServerSpec{TLS: v1alpha1.TLSSpec{SecretName: "tls"}}}
	issuer := &v1alpha1.BackupStorageLocationServer{Spec: v1alpha1.BackupStorageLocationServerSpec{TLS: v1alpha1.TLSSpec{IssuerRef: &v1alpha1.IssuerReference{Name: "corporate"}}}}
	for _, tt := range []struct {
		name                  string
		b                     *v1alpha1.BackupStorageLocationServer
		certManagerCA, served bool
		want                  tlsSource
	}{
		{"the admin's Secret, whatever the controller runs with", secret, true, true, tlsAdminSecret},
		{"the admin's issuer", issuer, true, true, tlsAdminIssuer},
		{"the admin's issuer without cert-manager: reported missing there", issuer, false, false, tlsAdminIssuer},
		{"nothing named, --cert-manager-ca and cert-manager served: its own CA through cert-manager", plain, true, true, tlsOwnCertManagerCA},
		{"nothing named, --cert-manager-ca without cert-manager: its own CA from the controller", plain, true, false, tlsOwnControllerCA},
		{"nothing named, cert-manager served but not asked for: its own CA from the controller", plain, false, true, tlsOwnControllerCA},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := chooseTLS(tt.b, tt.certManagerCA, tt.served); got != tt.want {
				t.Errorf("chooseTLS = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestServedNamespaces(t *testing.T) {
	var set UserSet
	for i := range set.Shards {
		set.Shards[i] = map[string]identity.Hash{}
	}
	if got := ServedNamespaces(set); len(got) != 0 {
		t.Errorf("no users: %v", got)
	}
	set.Shards[0]["db@team-b"] = identity.Hash{}
	set.Shards[3]["web@team-a"] = identity.Hash{}
	set.Shards[7]["cache@team-a"] = identity.Hash{}
	got := ServedNamespaces(set)
	if strings.Join(got, ",") != "team-a,team-b" {
		t.Errorf("ServedNamespaces = %v, want team-a, team-b", got)
	}
	msg := sharedMessage(got)
	for _, want := range []string{"VMs of 2 namespaces (team-a, team-b)", "deduplication", "one BackupStorageLocationServer per trust domain"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}
