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
	"github.com/guestbackup/guestbackup/pkg/optimistic"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
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
// pod uses it. Exactly one of S3, GCS and Azure is set, after Provider.
type VeleroStorage struct {
	// Provider is the BSL's provider without velero.io/: aws, gcp or azure.
	Provider string
	S3       *v1alpha1.S3Storage
	GCS      *GCSBucket
	Azure    *AzureContainer
	// Credentials name the Secret (in Velero's namespace) and key holding
	// the provider's credentials file: an AWS shared credentials file, a
	// GCP service account's JSON key, or Azure's KEY=VALUE file.
	Credentials corev1.SecretKeySelector
	// Profile is the AWS credentials file's profile.
	Profile string
	// AzureStorageKeyVariable is the key of Azure's credentials file
	// holding the storage account key (config.storageAccountKeyEnvVar);
	// empty means a service principal.
	AzureStorageKeyVariable string
}

// GCSBucket is a Google Cloud Storage bucket and the prefix of the
// repository's objects in it.
type GCSBucket struct {
	Bucket, Prefix string
}

// AzureContainer is an Azure Blob Storage container of a storage account,
// reached at <scheme>://<StorageAccount>.<StorageDomain>/, and the prefix
// of the repository's blobs in it.
type AzureContainer struct {
	Container, Prefix, StorageAccount string
	// StorageDomain is empty for Azure's public cloud (blob.core.windows.net).
	StorageDomain string
	DisableTLS    bool
}

// Velero's providers, as a BSL's spec.provider names them (with or
// without velero.io/).
const (
	ProviderAWS   = "aws"
	ProviderGCP   = "gcp"
	ProviderAzure = "azure"
)

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

// ParseVeleroBSL reads a Velero BackupStorageLocation of provider aws (S3
// and S3-compatible), gcp (Google Cloud Storage) or azure (Azure Blob
// Storage). Its errors say which field is wrong.
func ParseVeleroBSL(bsl *unstructured.Unstructured) (*VeleroStorage, error) {
	provider, _, _ := unstructured.NestedString(bsl.Object, "spec", "provider")
	bucket, _, _ := unstructured.NestedString(bsl.Object, "spec", "objectStorage", "bucket")
	prefix, _, _ := unstructured.NestedString(bsl.Object, "spec", "objectStorage", "prefix")
	config, _, _ := unstructured.NestedStringMap(bsl.Object, "spec", "config")
	// Velero's own data lives under <prefix>/backups etc.; ours beside it.
	prefix = strings.Trim(prefix+"/guestbackup", "/")
	vs := &VeleroStorage{
		Provider:    strings.TrimPrefix(provider, "velero.io/"),
		Credentials: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: VeleroDefaultCredentialsSecret}, Key: VeleroDefaultCredentialsKey},
	}
	switch vs.Provider {
	case ProviderAWS, ProviderGCP, ProviderAzure:
	default:
		return nil, fmt.Errorf("its spec.provider is %q: guestbackup reads aws (S3 and S3-compatible storage), gcp (Google Cloud Storage) and azure (Azure Blob Storage)", provider)
	}
	if bucket == "" {
		return nil, fmt.Errorf("it has no spec.objectStorage.bucket")
	}
	if name, _, _ := unstructured.NestedString(bsl.Object, "spec", "credential", "name"); name != "" {
		vs.Credentials.Name = name
		if key, _, _ := unstructured.NestedString(bsl.Object, "spec", "credential", "key"); key != "" {
			vs.Credentials.Key = key
		}
	}
	switch vs.Provider {
	case ProviderGCP:
		vs.GCS = &GCSBucket{Bucket: bucket, Prefix: prefix}
		return vs, nil
	case ProviderAzure:
		az, err := parseAzureConfig(config)
		if err != nil {
			return nil, err
		}
		az.Container, az.Prefix = bucket, prefix
		vs.Azure = az
		vs.AzureStorageKeyVariable = config["storageAccountKeyEnvVar"]
		return vs, nil
	}
	vs.S3 = &v1alpha1.S3Storage{Bucket: bucket, Prefix: prefix, Region: config["region"]}
	vs.Profile = config["profile"]
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
	if vs.Profile == "" {
		vs.Profile = "default"
	}
	return vs, nil
}

// caBundle is the CA bundle of an S3 endpoint with a private CA.
func (vs *VeleroStorage) caBundle() []byte {
	if vs.S3 == nil {
		return nil
	}
	return vs.S3.CABundle
}

// parseAzureConfig reads the storage account of an azure BSL's
// spec.config. Kopia reaches an account at <account>.<domain>, so a custom
// storageAccountURI (another cloud, a private endpoint, an emulator) must
// be of that form.
func parseAzureConfig(config map[string]string) (*AzureContainer, error) {
	account := config["storageAccount"]
	if account == "" {
		return nil, fmt.Errorf("it has no spec.config.storageAccount")
	}
	az := &AzureContainer{StorageAccount: account}
	uri := config["storageAccountURI"]
	if uri == "" {
		return az, nil
	}
	u, err := url.Parse(uri)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("spec.config.storageAccountURI %q is not a URL like https://%s.blob.core.windows.net", uri, account)
	}
	domain, ok := strings.CutPrefix(u.Host, account+".")
	if !ok || domain == "" {
		return nil, fmt.Errorf("spec.config.storageAccountURI %q: its host must be %s.<domain> (the storage account, then the blob endpoint's domain), as Kopia builds it", uri, account)
	}
	if domain != "blob.core.windows.net" {
		az.StorageDomain = domain
	}
	az.DisableTLS = u.Scheme == "http"
	return az, nil
}

// checkVeleroCredentials checks that data, the key of Velero's credential
// Secret, is what the provider's Kopia storage can use. Errors never quote
// the credentials.
func checkVeleroCredentials(vs *VeleroStorage, data []byte) (what string, err error) {
	switch vs.Provider {
	case ProviderGCP:
		return "a GCP service account key", storagecreds.CheckGCPKey(data)
	case ProviderAzure:
		_, err := storagecreds.ParseAzure(data, vs.AzureStorageKeyVariable)
		return "an Azure credentials file", err
	}
	_, _, _, err = storagecreds.ParseAWS(data, vs.Profile)
	return "an AWS credentials file", err
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
	if ref.Credentials == v1alpha1.CredentialsWorkloadIdentity {
		// No Secret to read: the pod reaches the storage as its
		// ServiceAccount's cloud identity, so it needs no access here.
		if err := r.revokeVeleroAccess(ctx, b, ""); err != nil {
			return nil, err
		}
		if err := r.finalize(ctx, b); err != nil {
			return nil, err
		}
		in.setStorage(b, vs)
		return nil, r.s3CABundle(ctx, b, vs.caBundle())
	}
	s := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: vs.Credentials.Name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return &problem{ReasonCredentialsInvalid, fmt.Sprintf("Secret %s not found in namespace %s (the credentials of %s): set the BSL's spec.credential, create Velero's default Secret %s, or set storage.backupStorageLocation.credentials to WorkloadIdentity when Velero uses none", vs.Credentials.Name, ref.Namespace, name, VeleroDefaultCredentialsSecret)}, nil
		}
		return nil, fmt.Errorf("get Secret %s/%s: %w", ref.Namespace, vs.Credentials.Name, err)
	}
	if _, ok := s.Data[vs.Credentials.Key]; !ok {
		return &problem{ReasonCredentialsInvalid, fmt.Sprintf("Secret %s/%s has no key %s (the credentials of %s): fix the BSL's spec.credential.key, or add the key", ref.Namespace, vs.Credentials.Name, vs.Credentials.Key, name)}, nil
	}
	if what, err := checkVeleroCredentials(vs, s.Data[vs.Credentials.Key]); err != nil {
		return &problem{ReasonCredentialsInvalid, fmt.Sprintf("Secret %s/%s, key %s, is not %s Kopia can use: %v", ref.Namespace, vs.Credentials.Name, vs.Credentials.Key, what, err)}, nil
	}
	if err := r.veleroAccess(ctx, b, vs.Credentials.Name); err != nil {
		return nil, err
	}
	// A Velero BSL in another namespace, used before, grants nothing more.
	if err := r.revokeVeleroAccess(ctx, b, ref.Namespace); err != nil {
		return nil, err
	}
	in.setStorage(b, vs)
	return nil, r.s3CABundle(ctx, b, vs.caBundle())
}

// veleroAccess lets b's server read one Secret in Velero's namespace, and
// puts the finalizer that removes that access with the BSLS.
func (r *Reconciler) veleroAccess(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, secret string) error {
	if err := r.addFinalizer(ctx, b, FinalizerVeleroAccess); err != nil {
		return err
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
	return r.finalizeWith(ctx, b, FinalizerVeleroAccess, func() error { return r.revokeVeleroAccess(ctx, b, "") })
}

// addFinalizer puts finalizer on b, by a patch, unless it is there: b's
// deletion then waits for finalizeWith to run its clean-up. The patch is
// guarded by b's resourceVersion (optimistic.Patch): a JSON merge patch
// replaces the list as a whole, and a finalizer another party added since
// must not be dropped, so the patch fails with a conflict instead, which
// the caller returns (the reconcile is retried from a fresh read).
func (r *Reconciler) addFinalizer(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, finalizer string) error {
	if controllerutil.ContainsFinalizer(b, finalizer) {
		return nil
	}
	if err := optimistic.Patch(ctx, r.Client, b, func() { controllerutil.AddFinalizer(b, finalizer) }); err != nil {
		return fmt.Errorf("add finalizer %s: %w", finalizer, err)
	}
	return nil
}

// finalizeWith runs cleanUp, then removes finalizer from b, when b carries
// it (addFinalizer), by a patch guarded by b's resourceVersion
// (optimistic.Patch).
func (r *Reconciler) finalizeWith(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, finalizer string, cleanUp func() error) error {
	if !controllerutil.ContainsFinalizer(b, finalizer) {
		return nil
	}
	if err := cleanUp(); err != nil {
		return err
	}
	if err := optimistic.Patch(ctx, r.Client, b, func() { controllerutil.RemoveFinalizer(b, finalizer) }); err != nil {
		return fmt.Errorf("remove finalizer %s: %w", finalizer, err)
	}
	return nil
}
