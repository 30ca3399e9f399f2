package kopiaserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/awscreds"
)

// +kubebuilder:rbac:groups=velero.io,resources=backupstoragelocations,verbs=get;list;watch
// revokeVeleroAccess deletes the access it granted in Velero's namespace;
// the finalizer that makes sure of it is added and removed by patches.
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=delete
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers,verbs=patch
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupstoragelocationservers/finalizers,verbs=update

// VeleroBSL is the kind of a Velero BackupStorageLocation.
var VeleroBSL = schema.GroupVersionKind{Group: "velero.io", Version: "v1", Kind: "BackupStorageLocation"}

// Velero's defaults: the Secret its install mounts when a BSL names none,
// and the key in it.
const (
	VeleroDefaultCredentialsSecret = "cloud-credentials"
	VeleroDefaultCredentialsKey    = "cloud"
)

// FinalizerVeleroAccess is on a BSLS that reuses a Velero BSL: the Role
// that lets its server read Velero's credential Secret lives in Velero's
// namespace, where no ownerReference can remove it.
const FinalizerVeleroAccess = "guestbackup.io/velero-access"

// VeleroAccessName is the Role and RoleBinding, in Velero's namespace, that
// let a BSLS's server read the one Secret holding the storage credentials.
// A namespace name has no dot, so no two BSLSs share one (with a dash,
// a-x/b and a/x-b did, and each took the other's access).
func VeleroAccessName(b *v1alpha1.BackupStorageLocationServer) string {
	return "guestbackup-" + b.Namespace + "." + b.Name
}

// VeleroStorage is what a Velero BSL says about its bucket, as the server
// pod uses it.
type VeleroStorage struct {
	S3 v1alpha1.S3Storage
	// Credentials name the Secret (in Velero's namespace) and key holding
	// an AWS shared credentials file, and the profile in it.
	Credentials corev1.SecretKeySelector
	Profile     string
}

// VeleroConsents reports whether a Velero BSL's annotations consent to the
// BSLS namespace/name reusing it: its guestbackup.io/allowed-servers
// annotation lists exactly that name (entries are comma-separated, spaces
// around them ignored). Only a Velero admin can annotate the BSL, so the
// grant of Velero's credentials is theirs, never a BSLS author's.
func VeleroConsents(annotations map[string]string, namespace, name string) bool {
	want := namespace + "/" + name
	for _, entry := range strings.Split(annotations[v1alpha1.AnnotationAllowedServers], ",") {
		if strings.TrimSpace(entry) == want {
			return true
		}
	}
	return false
}

// veleroConsentRequired is the problem of a BSLS that names a Velero BSL
// not consenting to it: the message says who sets which annotation on
// which object, without revealing whom else the BSL admits.
func veleroConsentRequired(ref *v1alpha1.BackupStorageLocationRef, b *v1alpha1.BackupStorageLocationServer) *problem {
	self := b.Namespace + "/" + b.Name
	return &problem{ReasonVeleroConsentRequired, fmt.Sprintf(
		"Velero BackupStorageLocation %s/%s does not consent to this server reading its credentials, so none is granted: "+
			"a Velero admin adds %s to the comma-separated list in its annotation %s "+
			"(kubectl -n %s annotate backupstoragelocation.velero.io %s %s=%s when it has none yet)",
		ref.Namespace, ref.Name, self, v1alpha1.AnnotationAllowedServers,
		ref.Namespace, ref.Name, v1alpha1.AnnotationAllowedServers, self)}
}

// ParseVeleroBSL reads an AWS-compatible Velero BackupStorageLocation. Its
// errors say which field is wrong.
func ParseVeleroBSL(bsl *unstructured.Unstructured) (*VeleroStorage, error) {
	provider, _, _ := unstructured.NestedString(bsl.Object, "spec", "provider")
	if p := strings.TrimPrefix(provider, "velero.io/"); p != "aws" {
		return nil, fmt.Errorf("its spec.provider is %q: only aws (S3-compatible storage) is supported", provider)
	}
	bucket, _, _ := unstructured.NestedString(bsl.Object, "spec", "objectStorage", "bucket")
	if bucket == "" {
		return nil, fmt.Errorf("it has no spec.objectStorage.bucket")
	}
	prefix, _, _ := unstructured.NestedString(bsl.Object, "spec", "objectStorage", "prefix")
	config, _, _ := unstructured.NestedStringMap(bsl.Object, "spec", "config")
	vs := &VeleroStorage{
		// Velero's own data lives under <prefix>/backups etc.; ours beside it.
		S3:          v1alpha1.S3Storage{Bucket: bucket, Prefix: strings.Trim(prefix+"/guestbackup", "/"), Region: config["region"]},
		Credentials: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: VeleroDefaultCredentialsSecret}, Key: VeleroDefaultCredentialsKey},
		Profile:     config["profile"],
	}
	if caCert, _, _ := unstructured.NestedString(bsl.Object, "spec", "objectStorage", "caCert"); caCert != "" {
		ca, err := base64.StdEncoding.DecodeString(caCert)
		if err != nil {
			return nil, fmt.Errorf("spec.objectStorage.caCert: %w", err)
		}
		vs.S3.CABundle = ca
	}
	if s3URL := config["s3Url"]; s3URL != "" {
		u, err := url.Parse(s3URL)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("spec.config.s3Url %q is not a URL like https://host:port", s3URL)
		}
		vs.S3.Endpoint = u.Host
		vs.S3.DisableTLS = u.Scheme == "http"
	}
	if name, _, _ := unstructured.NestedString(bsl.Object, "spec", "credential", "name"); name != "" {
		vs.Credentials.Name = name
		if key, _, _ := unstructured.NestedString(bsl.Object, "spec", "credential", "key"); key != "" {
			vs.Credentials.Key = key
		}
	}
	if vs.Profile == "" {
		vs.Profile = "default"
	}
	return vs, nil
}

// backupStorageLocation resolves a Velero BSL into S3 storage. Velero's
// credential Secret is not copied: a Role in Velero's namespace lets the
// server's service account read that one Secret, and the server pod's init
// container reads it through the API.
func (r *Reconciler) backupStorageLocation(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, in *WorkloadInputs) (*problem, error) {
	ref := b.Spec.Storage.BackupStorageLocation
	name := fmt.Sprintf("Velero BackupStorageLocation %s/%s", ref.Namespace, ref.Name)
	bsl := &unstructured.Unstructured{}
	bsl.SetGroupVersionKind(VeleroBSL)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, bsl); err != nil {
		switch {
		case meta.IsNoMatchError(err):
			return &problem{ReasonBackupStorageLocationInvalid, fmt.Sprintf("storage.backupStorageLocation names %s, but Velero's BackupStorageLocation CRD is not installed: install Velero, or use storage.s3 or storage.filesystem", name)}, nil
		case apierrors.IsNotFound(err):
			return &problem{ReasonBackupStorageLocationInvalid, fmt.Sprintf("%s not found: create it, or fix storage.backupStorageLocation", name)}, nil
		}
		return nil, fmt.Errorf("get %s: %w", name, err)
	}
	if !VeleroConsents(bsl.GetAnnotations(), b.Namespace, b.Name) {
		// No consent, no access: whatever was granted before goes too. The
		// BSL is checked first so that its author learns nothing of
		// Velero's Secrets.
		if err := r.revokeVeleroAccess(ctx, b, ""); err != nil {
			return nil, err
		}
		if err := r.finalize(ctx, b); err != nil {
			return nil, err
		}
		return veleroConsentRequired(ref, b), nil
	}
	vs, err := ParseVeleroBSL(bsl)
	if err != nil {
		return &problem{ReasonBackupStorageLocationInvalid, fmt.Sprintf("%s cannot be used: %v", name, err)}, nil
	}
	s := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: vs.Credentials.Name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return &problem{ReasonCredentialsInvalid, fmt.Sprintf("Secret %s not found in namespace %s (the credentials of %s): set the BSL's spec.credential, or create Velero's default Secret %s", vs.Credentials.Name, ref.Namespace, name, VeleroDefaultCredentialsSecret)}, nil
		}
		return nil, fmt.Errorf("get Secret %s/%s: %w", ref.Namespace, vs.Credentials.Name, err)
	}
	if _, _, _, err := awscreds.Parse(s.Data[vs.Credentials.Key], vs.Profile); err != nil {
		return &problem{ReasonCredentialsInvalid, fmt.Sprintf("Secret %s/%s, key %s, is not an AWS credentials file Kopia can use: %v", ref.Namespace, vs.Credentials.Name, vs.Credentials.Key, err)}, nil
	}
	if err := r.veleroAccess(ctx, b, vs.Credentials.Name); err != nil {
		return nil, err
	}
	// A Velero BSL in another namespace, used before, grants nothing more.
	if err := r.revokeVeleroAccess(ctx, b, ref.Namespace); err != nil {
		return nil, err
	}
	in.setStorage(b, vs)
	return nil, r.s3CABundle(ctx, b, vs.S3.CABundle)
}

// veleroAccess lets b's server read one Secret in Velero's namespace, and
// puts the finalizer that removes that access with the BSLS.
func (r *Reconciler) veleroAccess(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, secret string) error {
	if !controllerutil.ContainsFinalizer(b, FinalizerVeleroAccess) {
		patch := client.MergeFrom(b.DeepCopy())
		controllerutil.AddFinalizer(b, FinalizerVeleroAccess)
		if err := r.Client.Patch(ctx, b, patch); err != nil {
			return fmt.Errorf("add finalizer %s: %w", FinalizerVeleroAccess, err)
		}
	}
	ns := b.Spec.Storage.BackupStorageLocation.Namespace
	role, binding := VeleroAccessRole(b, secret)
	for _, obj := range []client.Object{role, binding} {
		if err := r.Client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil { //nolint:staticcheck // see apply
			return fmt.Errorf("apply %T %s/%s: %w", obj, ns, obj.GetName(), err)
		}
	}
	return nil
}

// VeleroAccessRole is the Role, in the Velero BSL's namespace, that lets
// b's server read the one credential Secret named secret, and its binding
// to the server's ServiceAccount. docs/security.md lists its rule.
func VeleroAccessRole(b *v1alpha1.BackupStorageLocationServer, secret string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	ns := b.Spec.Storage.BackupStorageLocation.Namespace
	meta := metav1.ObjectMeta{Name: VeleroAccessName(b), Namespace: ns, Labels: labels.Merge(Labels(b), map[string]string{LabelBSLSNamespace: b.Namespace})}
	role := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: meta,
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{secret}}},
	}
	binding := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: meta,
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccountName(b), Namespace: b.Namespace}},
	}
	return role, binding
}

// revokeVeleroAccess deletes the Roles and RoleBindings that let b's server
// read a Velero Secret, in every namespace but keep ("" keeps none). They
// are found by b's labels, never by name alone: a name in someone else's
// namespace is not proof that b wrote it.
func (r *Reconciler) revokeVeleroAccess(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, keep string) error {
	sel := client.MatchingLabels{LabelBSLS: b.Name, LabelBSLSNamespace: b.Namespace}
	// What the spec names is read from the API server: a grant made a
	// moment ago may not be in the cache yet.
	if ref := b.Spec.Storage.BackupStorageLocation; ref != nil && ref.Namespace != keep {
		key := client.ObjectKey{Namespace: ref.Namespace, Name: VeleroAccessName(b)}
		for _, obj := range []client.Object{&rbacv1.RoleBinding{}, &rbacv1.Role{}} {
			err := r.APIReader.Get(ctx, key, obj)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("read %T %s: %w", obj, key, err)
			}
			if !labels.SelectorFromSet(labels.Set(sel)).Matches(labels.Set(obj.GetLabels())) {
				continue
			}
			if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("delete %T %s: %w", obj, key, err)
			}
		}
	}
	for _, list := range []client.ObjectList{&rbacv1.RoleBindingList{}, &rbacv1.RoleList{}} {
		if err := r.Client.List(ctx, list, sel); err != nil {
			return fmt.Errorf("list the Velero access of %s/%s: %w", b.Namespace, b.Name, err)
		}
		if err := meta.EachListItem(list, func(o runtime.Object) error {
			obj := o.(client.Object)
			if obj.GetNamespace() == keep {
				return nil
			}
			if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("delete %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// finalize removes what a BSLS left outside its namespace, then its
// finalizer. It also runs when a BSLS stops using a Velero BSL.
func (r *Reconciler) finalize(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) error {
	if !controllerutil.ContainsFinalizer(b, FinalizerVeleroAccess) {
		return nil
	}
	if err := r.revokeVeleroAccess(ctx, b, ""); err != nil {
		return err
	}
	patch := client.MergeFrom(b.DeepCopy())
	controllerutil.RemoveFinalizer(b, FinalizerVeleroAccess)
	if err := r.Client.Patch(ctx, b, patch); err != nil {
		return fmt.Errorf("remove finalizer %s: %w", FinalizerVeleroAccess, err)
	}
	return nil
}
