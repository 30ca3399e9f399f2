package clientsecret

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// The Secret a pod mounts: every key the docs promise, a connect line with
// no secret in it, and the identity in two parts as kopia's flags take it.
func TestRender(t *testing.T) {
	c := &v1alpha1.BackupClient{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "dbdump", UID: "uid-1"},
		Spec:       v1alpha1.BackupClientSpec{Server: v1alpha1.ServerReference{Namespace: "backup", Name: "main"}},
	}
	hash1 := identity.Hash{Version: identity.Scrypt, Value: bytes.Repeat([]byte{1}, 64)}
	s := Render(c, Server{URL: "https://it's.example:51515", CA: "CA"}, Credentials{Generation: 2, Password: "s3cret", Hash: hash1, Rotate: "r"})
	want := map[string]string{
		KeyURL:          "https://it's.example:51515",
		KeyCA:           "CA",
		KeyUsername:     "dbdump",
		KeyHostname:     "shop.client",
		KeyPassword:     "s3cret",
		KeyGeneration:   "2",
		KeyConnect:      `kopia repository connect server --url='https://it'\''s.example:51515' --override-username='dbdump' --override-hostname='shop.client'` + "\n",
		KeyPasswordHash: hash1.String(),
	}
	if len(s.Data) != len(want) {
		t.Errorf("keys %d, want %d", len(s.Data), len(want))
	}
	for k, v := range want {
		if string(s.Data[k]) != v {
			t.Errorf("key %s = %q, want %q", k, s.Data[k], v)
		}
	}
	if !IsOf(s, c) {
		t.Error("the rendered Secret is not its client's")
	}
	if s.Name != "dbdump-backupclient" || s.Annotations[AnnotationRotate] != "r" {
		t.Errorf("name %s, rotate %q", s.Name, s.Annotations[AnnotationRotate])
	}
	if got := CredentialsOf(s); got.Generation != 2 || got.Password != "s3cret" || !got.Hash.Equal(hash1) || got.Rotate != "r" {
		t.Errorf("CredentialsOf = %+v", got)
	}
}
