package v1alpha1_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

var nameSeq int

func newBSLS(spec v1alpha1.BackupStorageLocationServerSpec) *v1alpha1.BackupStorageLocationServer {
	nameSeq++
	return &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bsls-%d", nameSeq), Namespace: "default"},
		Spec:       spec,
	}
}

func filesystem() v1alpha1.StorageSpec {
	return v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}
}

var _ = Describe("BackupStorageLocationServer", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("is served with short name bsls, a status subresource and the admin's printer columns", func() {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKey{Name: "backupstoragelocationservers.guestbackup.io"}, crd)).To(Succeed())
		Expect(crd.Spec.Names.ShortNames).To(ConsistOf("bsls"))
		Expect(crd.Spec.Scope).To(Equal(apiextensionsv1.NamespaceScoped))
		Expect(crd.Spec.Versions).To(HaveLen(1))
		version := crd.Spec.Versions[0]
		Expect(version.Subresources.Status).NotTo(BeNil())
		var columns []string
		for _, c := range version.AdditionalPrinterColumns {
			columns = append(columns, c.Name)
		}
		Expect(columns).To(Equal([]string{"Ready", "Endpoint", "Users", "Namespaces", "Age"}))
	})

	It("applies defaults to a minimal filesystem server", func() {
		bsls := newBSLS(v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem()})
		Expect(apiServer.Client.Create(ctx, bsls)).To(Succeed())

		got := &v1alpha1.BackupStorageLocationServer{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKeyFromObject(bsls), got)).To(Succeed())
		Expect(got.Spec.Replicas).To(HaveValue(BeEquivalentTo(1)))
		Expect(got.Spec.Service.Port).To(BeEquivalentTo(v1alpha1.DefaultServerPort))
		Expect(got.Spec.Service.Type).To(Equal(corev1.ServiceTypeClusterIP))
		Expect(got.Spec.Storage).To(Equal(filesystem()))
	})

	It("stores a fully specified server unchanged", func() {
		spec := v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{S3: &v1alpha1.S3Storage{
				Bucket: "vm-backups", Endpoint: "minio.storage.svc:9000", Region: "eu-west-1",
				Prefix: "cluster-a/", CredentialsSecret: corev1.LocalObjectReference{Name: "s3-creds"},
				CABundle: []byte("-----BEGIN CERTIFICATE-----\n"), DisableTLS: false,
			}},
			Repository: v1alpha1.RepositorySpec{
				PasswordSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "repo"}, Key: "password"},
				PathPrefix:        "guests/prod",
				DefaultPolicy: &v1alpha1.PolicySpec{
					Retention:   &v1alpha1.RetentionPolicy{KeepLatest: ptr.To[int32](10), KeepDaily: ptr.To[int32](7), KeepAnnual: ptr.To[int32](0)},
					Compression: "zstd",
				},
			},
			TLS: v1alpha1.TLSSpec{IssuerRef: &v1alpha1.IssuerReference{Name: "ca", Kind: "Issuer", Group: "cert-manager.io"}},
			Access: v1alpha1.AccessSpec{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}},
				AppendOnly:        true,
				ClientIPBlocks: []v1alpha1.IPBlock{
					{CIDR: "192.168.10.0/24", Except: []string{"192.168.10.0/30"}},
					{CIDR: "2001:db8::/64"},
				},
				PasswordHash: v1alpha1.PasswordHashPBKDF2,
			},
			Service: v1alpha1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Port: 443, Annotations: map[string]string{"lb": "internal"}},
			PodConfig: v1alpha1.PodConfig{
				Resources:         corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}},
				NodeSelector:      map[string]string{"node-role": "storage"},
				Tolerations:       []corev1.Toleration{{Key: "storage", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
				PriorityClassName: "system-cluster-critical",
			},
			Replicas:  ptr.To[int32](2),
			ClientURL: "https://backup.example.com:8443",
		}
		bsls := newBSLS(spec)
		Expect(apiServer.Client.Create(ctx, bsls)).To(Succeed())
		got := &v1alpha1.BackupStorageLocationServer{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKeyFromObject(bsls), got)).To(Succeed())
		Expect(got.Spec).To(Equal(spec))
	})

	It("keeps status apart from spec", func() {
		bsls := newBSLS(v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem()})
		Expect(apiServer.Client.Create(ctx, bsls)).To(Succeed())
		bsls.Status = v1alpha1.BackupStorageLocationServerStatus{
			ObservedGeneration: bsls.Generation,
			Endpoint:           "https://bsls.default.svc:51515",
			TLSFingerprint:     "ab12",
			Users:              3,
			Namespaces:         2,
			RepositoryOpened:   ptr.To(metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))),
			Conditions: []metav1.Condition{{
				Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "ServerReady",
				Message: "guests can connect", LastTransitionTime: metav1.Now(),
			}},
		}
		Expect(apiServer.Client.Status().Update(ctx, bsls)).To(Succeed())
		generation := bsls.Generation

		got := &v1alpha1.BackupStorageLocationServer{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKeyFromObject(bsls), got)).To(Succeed())
		Expect(got.Status.Users).To(BeEquivalentTo(3))
		Expect(got.Status.Namespaces).To(BeEquivalentTo(2))
		Expect(got.Status.RepositoryOpened.Time).To(BeTemporally("==", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		Expect(got.Generation).To(Equal(generation), "a status write must not bump the generation")
	})

	DescribeTable("rejects an invalid spec with a message that says what to fix",
		func(spec v1alpha1.BackupStorageLocationServerSpec, message string) {
			err := apiServer.Client.Create(ctx, newBSLS(spec))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("no storage kind", v1alpha1.BackupStorageLocationServerSpec{},
			"set exactly one of storage.filesystem, storage.s3 or storage.backupStorageLocation"),
		Entry("two storage kinds", v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
			Filesystem:            &v1alpha1.FilesystemStorage{},
			BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: "default", Namespace: "velero"},
		}}, "set exactly one of storage.filesystem, storage.s3 or storage.backupStorageLocation"),
		Entry("an existing claim with a size", v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
			Filesystem: &v1alpha1.FilesystemStorage{ClaimName: "repo", Size: ptr.To(resource.MustParse("1Gi"))},
		}}, "size and storageClassName only apply to a claim the controller creates"),
		Entry("S3 without a bucket", v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
			S3: &v1alpha1.S3Storage{CredentialsSecret: corev1.LocalObjectReference{Name: "creds"}},
		}}, "spec.storage.s3.bucket"),
		Entry("S3 endpoint with a scheme", v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
			S3: &v1alpha1.S3Storage{Bucket: "b-1", Endpoint: "https://s3.example.com", CredentialsSecret: corev1.LocalObjectReference{Name: "creds"}},
		}}, "spec.storage.s3.endpoint"),
		Entry("both an issuer and a TLS Secret", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			TLS: v1alpha1.TLSSpec{IssuerRef: &v1alpha1.IssuerReference{Name: "ca"}, SecretName: "tls"},
		}, "set at most one of tls.issuerRef and tls.secretName"),
		Entry("a plain-HTTP client URL", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			ClientURL: "http://backup.example.com:51515"}, "spec.clientURL"),
		Entry("negative replicas", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Replicas: ptr.To[int32](-1)}, "spec.replicas"),
		Entry("a client range that is no CIDR", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Access: v1alpha1.AccessSpec{ClientIPBlocks: []v1alpha1.IPBlock{{CIDR: "192.168.10.5"}}}},
			"spec.access.clientIPBlocks[0].cidr"),
		Entry("a client range excepting addresses outside it", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Access: v1alpha1.AccessSpec{ClientIPBlocks: []v1alpha1.IPBlock{{CIDR: "192.168.10.0/24", Except: []string{"192.168.11.0/30"}}}}},
			"each range of except must lie strictly inside cidr"),
		Entry("a client range excepting all of itself", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Access: v1alpha1.AccessSpec{ClientIPBlocks: []v1alpha1.IPBlock{{CIDR: "192.168.10.0/24", Except: []string{"192.168.10.0/24"}}}}},
			"each range of except must lie strictly inside cidr"),
		Entry("an unknown compressor", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Repository: v1alpha1.RepositorySpec{DefaultPolicy: &v1alpha1.PolicySpec{Compression: "brotli"}}},
			"spec.repository.defaultPolicy.compression"),
		Entry("a guest spread over a day", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			GuestSpread: &metav1.Duration{Duration: 25 * time.Hour}}, "guestSpread is between 0s and 24h"),
		Entry("an unknown password hash", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Access: v1alpha1.AccessSpec{PasswordHash: "md5"}}, "spec.access.passwordHash"),
		Entry("a negative quota", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Quota: &v1alpha1.QuotaSpec{PerVM: resource.NewQuantity(-50<<30, resource.BinarySI)}}, "a quota is not negative"),
		Entry("a quota measured every second", v1alpha1.BackupStorageLocationServerSpec{Storage: filesystem(),
			Quota: &v1alpha1.QuotaSpec{MeasureInterval: &metav1.Duration{Duration: time.Second}}}, "measureInterval is at least 10s"),
	)
})
