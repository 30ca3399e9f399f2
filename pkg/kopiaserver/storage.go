package kopiaserver

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/password"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
)

// DefaultClaimSize is the size of a filesystem claim the controller creates
// when the BSLS names none.
var DefaultClaimSize = resource.MustParse("10Gi")

// AnnotationKeep on an object the controller created says why it outlives
// its BSLS: it has no ownerReference on purpose.
const AnnotationKeep = "guestbackup.io/keep"

// S3CABundleName is the ConfigMap holding an S3 endpoint's CA bundle.
func S3CABundleName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-s3-ca" }

// storage resolves where the repository lives into the workload's inputs,
// creating the filesystem claim and the CA bundle ConfigMap when needed. A
// problem says what the admin must fix.
func (r *Reconciler) storage(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, in *WorkloadInputs) (*problem, error) {
	if b.Spec.Storage.BackupStorageLocation == nil {
		// No longer a Velero BSL's user: its server loses that access.
		if err := r.finalize(ctx, b); err != nil {
			return nil, err
		}
	}
	switch st := b.Spec.Storage; {
	case st.Filesystem != nil:
		return r.claim(ctx, b)
	case st.S3 != nil:
		if p, err := r.checkS3Credentials(ctx, b.Namespace, st.S3.CredentialsSecret.Name); p != nil || err != nil {
			return p, err
		}
		in.setStorage(b, nil)
		return nil, r.s3CABundle(ctx, b, st.S3.CABundle)
	case st.BackupStorageLocation != nil:
		return r.backupStorageLocation(ctx, b, in)
	default:
		// The CRD's validation makes this unreachable through the API.
		return &problem{ReasonRepositoryInitFailed, "spec.storage sets no storage kind: set exactly one of filesystem, s3 or backupStorageLocation"}, nil
	}
}

// setStorage fills in the storage part of in: the bucket, its
// credentials and its CA bundle, from b's own S3 storage or, when b reuses
// a Velero BSL, from vs, what that BSL says. Filesystem storage needs none.
func (in *WorkloadInputs) setStorage(b *v1alpha1.BackupStorageLocationServer, vs *VeleroStorage) {
	var bundle []byte
	switch ref := b.Spec.Storage.BackupStorageLocation; {
	case ref != nil && vs != nil:
		in.S3, in.GCS, in.Azure = vs.S3, vs.GCS, vs.Azure
		if ref.Credentials == v1alpha1.CredentialsWorkloadIdentity {
			in.WorkloadIdentity = true
		} else {
			in.VeleroCredentials = &VeleroCredentials{Namespace: ref.Namespace, Secret: vs.Credentials.Name, Key: vs.Credentials.Key, Profile: vs.Profile, AzureStorageKeyVariable: vs.AzureStorageKeyVariable}
		}
		bundle = vs.caBundle()
	case b.Spec.Storage.S3 != nil:
		in.S3 = b.Spec.Storage.S3
		in.S3CredentialsSecret = b.Spec.Storage.S3.CredentialsSecret.Name
		bundle = b.Spec.Storage.S3.CABundle
	}
	if len(bundle) > 0 {
		in.S3CABundleConfigMap = S3CABundleName(b)
	}
}

// s3CABundle keeps an S3 endpoint's CA bundle in a ConfigMap the init
// container mounts (a bundle is no secret), when there is one.
func (r *Reconciler) s3CABundle(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, bundle []byte) error {
	if len(bundle) == 0 {
		return nil
	}
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: S3CABundleName(b), Namespace: b.Namespace, Labels: Labels(b)},
		Data:       map[string]string{"ca.crt": string(bundle)},
	}
	return r.apply(ctx, b, cm)
}

// claim checks the admin's claim, or creates the controller's own. The
// controller's claim has no ownerReference: deleting the BSLS must not
// delete the backups on it.
func (r *Reconciler) claim(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*problem, error) {
	fs := b.Spec.Storage.Filesystem
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: ClaimName(b)}, pvc)
	switch {
	case err == nil:
		return claimShared(b, pvc), nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get PersistentVolumeClaim %s: %w", ClaimName(b), err)
	case fs.ClaimName != "":
		return &problem{ReasonClaimNotFound, fmt.Sprintf("PersistentVolumeClaim %s not found in namespace %s: create it, or remove storage.filesystem.claimName so that the controller creates one", fs.ClaimName, b.Namespace)}, nil
	}
	size := DefaultClaimSize
	if fs.Size != nil {
		size = *fs.Size
	}
	pvc = &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: ClaimName(b), Namespace: b.Namespace, Labels: Labels(b),
			Annotations: map[string]string{AnnotationKeep: "holds the backups of BackupStorageLocationServer " + b.Name + "; not deleted with it"},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{claimAccessMode(b)},
			StorageClassName: fs.StorageClassName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if err := r.Client.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create PersistentVolumeClaim %s: %w", pvc.Name, err)
	}
	r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonClaimCreated, "Created PersistentVolumeClaim %s (%s) for the repository; it is kept when the BackupStorageLocationServer is deleted", pvc.Name, size.String())
	return nil, nil
}

// claimAccessMode is the access mode of the claim the controller creates:
// ReadWriteMany when b runs several server pods, which may run on several
// nodes, else ReadWriteOnce, which every storage class offers.
func claimAccessMode(b *v1alpha1.BackupStorageLocationServer) corev1.PersistentVolumeAccessMode {
	if SharesMaintenance(b) {
		return corev1.ReadWriteMany
	}
	return corev1.ReadWriteOnce
}

// claimShared is the problem of a BSLS with several server pods on a claim
// they cannot all mount: one without ReadWriteMany (ReadWriteOnce binds it
// to one node, ReadWriteOncePod to one pod). The Deployment is then left as
// it is, so the pods already running keep serving.
func claimShared(b *v1alpha1.BackupStorageLocationServer, pvc *corev1.PersistentVolumeClaim) *problem {
	if !SharesMaintenance(b) || slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
		return nil
	}
	return &problem{ReasonStorageNotShared, fmt.Sprintf(
		"spec.replicas is %d but PersistentVolumeClaim %s is not ReadWriteMany (access modes %v): server pods on other nodes cannot mount it. Set replicas to 1, or use S3 storage or a ReadWriteMany claim (storage.filesystem.claimName)",
		*b.Spec.Replicas, pvc.Name, pvc.Spec.AccessModes)}
}

// checkS3Credentials checks that a Secret holds S3 credentials, without
// reading them anywhere but here.
func (r *Reconciler) checkS3Credentials(ctx context.Context, namespace, name string) (*problem, error) {
	s := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return &problem{ReasonCredentialsInvalid, fmt.Sprintf("Secret %s not found in namespace %s: create it with the keys %s and %s", name, namespace, storagecreds.AccessKeyID, storagecreds.SecretAccessKey)}, nil
		}
		return nil, fmt.Errorf("get Secret %s: %w", name, err)
	}
	for _, key := range []string{storagecreds.AccessKeyID, storagecreds.SecretAccessKey} {
		if len(s.Data[key]) == 0 {
			return &problem{ReasonCredentialsInvalid, fmt.Sprintf("Secret %s has no key %s", name, key)}, nil
		}
	}
	return nil, nil
}

// repositoryPassword checks the admin's password Secret, or generates the
// controller's own. The generated Secret has no ownerReference: without it
// every backup in the repository is lost.
func (r *Reconciler) repositoryPassword(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*problem, error) {
	sel := RepositoryPassword(b)
	s := &corev1.Secret{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: sel.Name}, s)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get Secret %s: %w", sel.Name, err)
	}
	found := err == nil
	if generate, p := decidePassword(b, found, found && len(s.Data[sel.Key]) > 0); !generate {
		return p, nil
	}
	generated := password.New()
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: sel.Name, Namespace: b.Namespace, Labels: Labels(b),
			Annotations: map[string]string{
				AnnotationKeep: "decrypts every backup of BackupStorageLocationServer " + b.Name + "; not deleted with it",
				// The CA's key is derived from this password (cakey.go).
				AnnotationCAKeyGeneration: "0",
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{sel.Key: []byte(generated)},
	}
	if err := r.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create Secret %s: %w", s.Name, err)
	}
	r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonRepositoryPasswordGenerated, "Generated the repository password in Secret %s for a repository this BackupStorageLocationServer never opened; back it up: it is kept when the BackupStorageLocationServer is deleted, and without it the backups cannot be read", s.Name)
	return nil, nil
}

// controlSecret makes sure the server-control password exists. It is the
// BSLS's own: a new one is harmless, so it is owned and deleted with it.
func (r *Reconciler) controlSecret(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) error {
	s := &corev1.Secret{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: ControlSecretName(b)}, s)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get Secret %s: %w", ControlSecretName(b), err)
	}
	generated := password.New()
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: ControlSecretName(b), Namespace: b.Namespace, Labels: Labels(b)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"password": []byte(generated)},
	}
	if err := r.own(b, s); err != nil {
		return err
	}
	if err := r.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Secret %s: %w", s.Name, err)
	}
	return nil
}
