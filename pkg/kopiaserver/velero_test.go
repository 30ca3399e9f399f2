package kopiaserver

import (
	"encoding/base64"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

func veleroBSL(t *testing.T, spec string) *unstructured.Unstructured {
	t.Helper()
	obj := map[string]any{}
	if err := yaml.Unmarshal([]byte("apiVersion: velero.io/v1\nkind: BackupStorageLocation\nmetadata: {name: default, namespace: velero}\nspec:\n"+spec), &obj); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

func TestParseVeleroBSL(t *testing.T) {
	ca := base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----"))
	tests := []struct {
		name, spec string
		want       *VeleroStorage
		wantErr    string
	}{
		{
			name: "MinIO over plain HTTP with its own credential Secret",
			spec: `
  provider: aws
  objectStorage: {bucket: velero, prefix: cluster-a}
  config: {region: minio, s3Url: "http://minio.velero.svc:9000", s3ForcePathStyle: "true"}
  credential: {name: minio-creds, key: creds}`,
			want: &VeleroStorage{
				Provider:    "aws",
				S3:          &v1alpha1.S3Storage{Bucket: "velero", Prefix: "cluster-a/guestbackup", Region: "minio", Endpoint: "minio.velero.svc:9000", DisableTLS: true},
				Credentials: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "minio-creds"}, Key: "creds"},
				Profile:     "default",
			},
		},
		{
			name: "AWS with Velero's default Secret, a profile and a CA",
			spec: `
  provider: velero.io/aws
  objectStorage: {bucket: b, caCert: "` + ca + `"}
  config: {region: eu-west-1, profile: backup}`,
			want: &VeleroStorage{
				Provider:    "aws",
				S3:          &v1alpha1.S3Storage{Bucket: "b", Prefix: "guestbackup", Region: "eu-west-1", CABundle: []byte("-----BEGIN CERTIFICATE-----")},
				Credentials: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cloud-credentials"}, Key: "cloud"},
				Profile:     "backup",
			},
		},
		{
			name: "GCS with Velero's default Secret",
			spec: `
  provider: velero.io/gcp
  objectStorage: {bucket: velero-backups, prefix: prod}
  config: {serviceAccount: velero@project.iam.gserviceaccount.com}`,
			want: &VeleroStorage{
				Provider:    "gcp",
				GCS:         &GCSBucket{Bucket: "velero-backups", Prefix: "prod/guestbackup"},
				Credentials: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cloud-credentials"}, Key: "cloud"},
			},
		},
		{
			name: "Azure in the public cloud, with a storage account key",
			spec: `
  provider: azure
  objectStorage: {bucket: velero}
  config: {resourceGroup: rg, storageAccount: backups, storageAccountKeyEnvVar: AZURE_STORAGE_ACCOUNT_ACCESS_KEY, storageAccountURI: "https://backups.blob.core.windows.net"}
  credential: {name: azure-creds, key: cloud}`,
			want: &VeleroStorage{
				Provider:                "azure",
				Azure:                   &AzureContainer{Container: "velero", Prefix: "guestbackup", StorageAccount: "backups"},
				Credentials:             corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "azure-creds"}, Key: "cloud"},
				AzureStorageKeyVariable: "AZURE_STORAGE_ACCOUNT_ACCESS_KEY",
			},
		},
		{
			name: "Azure at another endpoint over plain HTTP, with a service principal",
			spec: `
  provider: velero.io/azure
  objectStorage: {bucket: velero, prefix: c}
  config: {resourceGroup: rg, storageAccount: devstoreaccount1, storageAccountURI: "http://devstoreaccount1.blob.azurite.test:10000/"}`,
			want: &VeleroStorage{
				Provider:    "azure",
				Azure:       &AzureContainer{Container: "velero", Prefix: "c/guestbackup", StorageAccount: "devstoreaccount1", StorageDomain: "blob.azurite.test:10000", DisableTLS: true},
				Credentials: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cloud-credentials"}, Key: "cloud"},
			},
		},
		{name: "another provider", spec: "  provider: velero.io/oci\n  objectStorage: {bucket: b}", wantErr: `its spec.provider is "velero.io/oci": guestbackup reads aws (S3 and S3-compatible storage), gcp (Google Cloud Storage) and azure (Azure Blob Storage)`},
		{name: "no provider", spec: "  objectStorage: {bucket: b}", wantErr: `its spec.provider is ""`},
		{name: "Azure without a storage account", spec: "  provider: azure\n  objectStorage: {bucket: b}\n  config: {resourceGroup: rg}", wantErr: "it has no spec.config.storageAccount"},
		{name: "Azure at a URI Kopia cannot build", spec: "  provider: azure\n  objectStorage: {bucket: b}\n  config: {storageAccount: acct, storageAccountURI: \"https://10.0.0.4/acct\"}", wantErr: "its host must be acct.<domain>"},
		{name: "Azure at a URI that is no URL", spec: "  provider: azure\n  objectStorage: {bucket: b}\n  config: {storageAccount: acct, storageAccountURI: acct.blob.core.windows.net}", wantErr: "is not a URL like https://acct.blob.core.windows.net"},
		{name: "no bucket", spec: "  provider: aws\n  objectStorage: {prefix: p}", wantErr: "no spec.objectStorage.bucket"},
		{name: "a bad s3Url", spec: "  provider: aws\n  objectStorage: {bucket: b}\n  config: {s3Url: minio}", wantErr: `spec.config.s3Url "minio" is not a URL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseVeleroBSL(veleroBSL(t, tt.spec))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseVeleroBSL =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}
