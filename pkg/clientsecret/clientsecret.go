// Package clientsecret owns the BackupClient credential Secret contract:
// its name, labels, keys, whose Secret it is, and its one rendering. The
// BackupClient reconciler (pkg/backupclient) writes it; the BSLS
// reconciler (pkg/kopiaserver) reads the hash from it; the workload's pods
// mount it (docs/clients.md).
//
// Identity comes from facts, never from data (docs/design.md, decisions 10
// and 25): a client's Kopia user is identity.OfClient of the BackupClient
// that controls the Secret, never its username or hostname keys, which are
// there for the workload only.
package clientsecret

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// LabelClient names the BackupClient a Secret holds the credentials of;
// with v1alpha1.LabelManagedBy, it puts the Secret in the controller's
// cache and under the chart's Secret policy (only guestbackup writes it).
const LabelClient = v1alpha1.AnnotationPrefix + "backupclient"

// Keys of the Secret. Those a workload reads are named as the files a pod
// mounts; the password is also the one a pod passes to kopia in
// KOPIA_PASSWORD (an env entry with valueFrom.secretKeyRef).
const (
	// KeyURL is the server's URL, the BSLS's status.endpoint.
	KeyURL = "url"
	// KeyCA is the BSLS's CA (PEM, status.tlsCA): the client's only trust.
	KeyCA = "ca.crt"
	// KeyUsername and KeyHostname are the two parts of the identity, as
	// kopia's --override-username and --override-hostname take them.
	KeyUsername = "username"
	KeyHostname = "hostname"
	// KeyPassword is the client's own password (never the repository's).
	KeyPassword = "password"
	// KeyGeneration counts the credentials issued: 1, then one more per
	// rotation.
	KeyGeneration = "generation"
	// KeyConnect is a ready `kopia repository connect server` line, which
	// takes the password from KOPIA_PASSWORD and the trust from
	// SSL_CERT_FILE (never from its arguments).
	KeyConnect = "connect"
	// KeyPasswordHash is KeyPassword hashed as Kopia stores it: what the
	// BSLS reconciler hands the server.
	KeyPasswordHash = v1alpha1.SecretKeyPasswordHash
)

// AnnotationRotate records the spec.rotate the current credentials were
// issued for: a different spec.rotate issues new ones.
const AnnotationRotate = v1alpha1.AnnotationRotate

// DefaultNameSuffix ends the default Secret name, <client>-backupclient.
const DefaultNameSuffix = "-backupclient"

// Name is the Secret c's credentials go to.
func Name(c *v1alpha1.BackupClient) string {
	if c.Spec.SecretName != "" {
		return c.Spec.SecretName
	}
	return c.Name + DefaultNameSuffix
}

// Labels are the labels of client's Secret.
func Labels(client string) map[string]string {
	return map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, LabelClient: client}
}

// Selector selects the client Secrets.
func Selector() labels.Selector {
	managed, _ := labels.NewRequirement(v1alpha1.LabelManagedBy, selection.Equals, []string{v1alpha1.ManagedByValue})
	client, _ := labels.NewRequirement(LabelClient, selection.Exists, nil)
	return labels.NewSelector().Add(*managed, *client)
}

// Client is the BackupClient s is labelled for; "" for none.
func Client(s *corev1.Secret) string {
	if s.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		return ""
	}
	return s.Labels[LabelClient]
}

// IsOf is whether s is the credential Secret of c: at c's Secret name, in
// c's namespace, labelled for it, and controlled by c itself (its UID, so
// not by an earlier client of the same name).
func IsOf(s *corev1.Secret, c *v1alpha1.BackupClient) bool {
	if s == nil || s.Namespace != c.Namespace || s.Name != Name(c) || Client(s) != c.Name {
		return false
	}
	ref := metav1.GetControllerOf(s)
	return ref != nil && ref.UID == c.UID && ref.Kind == "BackupClient" &&
		ref.APIVersion == v1alpha1.GroupVersion.String() && ref.Name == c.Name
}

// Generation is the credentials generation s holds; 0 for none.
func Generation(s *corev1.Secret) int64 {
	g, err := strconv.ParseInt(string(s.Data[KeyGeneration]), 10, 64)
	if err != nil || g < 0 {
		return 0
	}
	return g
}

// Hash is the hash of s's password; nil when s has none that parses.
func Hash(s *corev1.Secret) *identity.Hash {
	h, err := identity.ParseHash(string(s.Data[KeyPasswordHash]))
	if err != nil {
		return nil
	}
	return &h
}

// Server is what the Secret tells a workload about its server.
type Server struct {
	// URL is the BSLS's status.endpoint.
	URL string
	// CA is its status.tlsCA (PEM).
	CA string
}

// Credentials are one generation of a client's credentials.
type Credentials struct {
	Generation int64
	Password   string
	Hash       identity.Hash
	// Rotate is the spec.rotate they were issued for.
	Rotate string
}

// CredentialsOf reads back what Render wrote into s.
func CredentialsOf(s *corev1.Secret) Credentials {
	c := Credentials{Generation: Generation(s), Password: string(s.Data[KeyPassword]), Rotate: s.Annotations[AnnotationRotate]}
	if h := Hash(s); h != nil {
		c.Hash = *h
	}
	return c
}

// Render is client c's Secret for server with creds: the whole Secret, so
// that what a workload reads always matches the server and the generation.
//
// A client whose password only its admin knows (spec.passwordHash) has
// creds without one, and its Secret has no password key.
func Render(c *v1alpha1.BackupClient, server Server, creds Credentials) *corev1.Secret {
	user, host, _ := strings.Cut(identity.OfClient(c.Name, c.Namespace), "@")
	data := map[string][]byte{
		KeyURL:          []byte(server.URL),
		KeyCA:           []byte(server.CA),
		KeyUsername:     []byte(user),
		KeyHostname:     []byte(host),
		KeyGeneration:   []byte(strconv.FormatInt(creds.Generation, 10)),
		KeyConnect:      []byte(ConnectLine(server.URL, user, host)),
		KeyPasswordHash: []byte(creds.Hash.String()),
	}
	if creds.Password != "" {
		data[KeyPassword] = []byte(creds.Password)
	}
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: Name(c), Namespace: c.Namespace,
			Labels:      Labels(c.Name),
			Annotations: map[string]string{AnnotationRotate: creds.Rotate},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "BackupClient", Name: c.Name, UID: c.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// PasswordHashKey is the key of the admin's Secret that holds the hash of
// a client's own password (spec.passwordHash).
func PasswordHashKey(src *v1alpha1.PasswordHashSource) string {
	if src.Key != "" {
		return src.Key
	}
	return KeyPasswordHash
}

// ConnectLine is the `kopia repository connect server` command of a client:
// every argument quoted for a POSIX shell, and no secret among them. kopia
// reads the password from KOPIA_PASSWORD, and Go's TLS the client's only
// trust from SSL_CERT_FILE (the Secret's ca.crt as the pod mounts it).
func ConnectLine(url, user, host string) string {
	return fmt.Sprintf("kopia repository connect server --url=%s --override-username=%s --override-hostname=%s\n",
		shellQuote(url), shellQuote(user), shellQuote(host))
}

// shellQuote quotes s as one word of a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
