package kopiaserver_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
)

// These specs keep repositories in Google Cloud Storage and Azure Blob
// Storage, played by their emulators on loopback (fake-gcs-server,
// Azurite), reached through Velero BackupStorageLocations of providers gcp
// and azure: with Velero's credential Secret, and with no static key at all
// (workload identity). The server pod runs from the Deployment the
// controller wrote; the test bed adds only what the cloud would provide,
// the emulator's address (testbed.FakeGCS.Env, testbed.Azurite.Env).
var _ = Describe("Velero gcp and azure storage, on their emulators", Ordered, func() {
	const (
		veleroNS = "velero"
		gcsNS    = "on-gcs"
		azureNS  = "on-azure"
		wiNS     = "workload-identity"
		badNS    = "bad-bsl"
	)
	var (
		ctx      context.Context
		api      *testbed.APIServer
		gcs      *testbed.FakeGCS
		azurite  *testbed.Azurite
		binaries map[string]string
	)

	deployment := func(b *v1alpha1.BackupStorageLocationServer) *appsv1.Deployment {
		GinkgoHelper()
		d := &appsv1.Deployment{}
		Eventually(func() error {
			return api.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: kopiaserver.DeploymentName(b)}, d)
		}).WithTimeout(reconciled).Should(Succeed())
		return d
	}
	// connect connects a VM's user through the Kopia server, which reads
	// the repository from the cloud's storage.
	connect := func(pod *testbed.Pod, b *v1alpha1.BackupStorageLocationServer, vm string) {
		GinkgoHelper()
		password := testbed.RandomPassword()
		Expect(createCredential(ctx, api, credentialSecret(vm, b.Namespace, b.Namespace, b.Name, password, "1"))).To(Succeed())
		Eventually(connectGuest(ctx, api, pod, b, vm+"@"+b.Namespace, password)).WithTimeout(provisioned).Should(Succeed())
	}
	// bsl is a Velero BSL of veleroNS that every BSLS of this file may
	// reuse.
	bsl := func(name, provider, bucket, prefix string, config map[string]any, credential map[string]any) *unstructured.Unstructured {
		return veleroBSL(veleroNS, name, provider, bucket, prefix, config, credential,
			gcsNS+"/reuse", azureNS+"/reuse", wiNS+"/reuse", badNS+"/oci", badNS+"/no-key", badNS+"/no-secret")
	}
	bsls := func(ns, name, bsl string, credentials v1alpha1.CredentialsSource, annotations map[string]string) *v1alpha1.BackupStorageLocationServer {
		return &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{
					Name: bsl, Namespace: veleroNS, Credentials: credentials,
				}},
				PodConfig: v1alpha1.PodConfig{ServiceAccount: v1alpha1.ServerServiceAccount{Annotations: annotations}},
			},
		}
	}
	// deploymentHolds reports whether any of values is in the Deployment.
	deploymentHolds := func(d *appsv1.Deployment, values ...string) bool {
		data, err := json.Marshal(d)
		Expect(err).NotTo(HaveOccurred())
		for _, v := range values {
			if strings.Contains(string(data), v) {
				return true
			}
		}
		return false
	}

	BeforeAll(func() {
		ctx = context.Background()
		api, binaries = startStorageController(ctx, veleroNS, gcsNS, azureNS, wiNS, badNS)
		gcs = testbed.StartFakeGCS(GinkgoT())
		azurite = testbed.StartAzurite(GinkgoT())
	})

	Describe("a BSLS reusing a gcp BSL with a service account key", Ordered, func() {
		const bucket, prefix = "velero-gcs", "cluster-g"
		var (
			b   *v1alpha1.BackupStorageLocationServer
			key []byte
		)

		BeforeAll(func() {
			Expect(gcs.CreateBucket(bucket)).To(Succeed())
			key = serviceAccountKey()
			// Velero's default Secret: the BSL names none.
			Expect(api.Client.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: kopiaserver.VeleroDefaultCredentialsSecret, Namespace: veleroNS},
				Data:       map[string][]byte{kopiaserver.VeleroDefaultCredentialsKey: key},
			})).To(Succeed())
			Expect(api.Client.Create(ctx, bsl("gcs", "velero.io/gcp", bucket, prefix, map[string]any{"serviceAccount": "velero@testbed.iam.gserviceaccount.com"}, nil))).To(Succeed())
			b = bsls(gcsNS, "reuse", "gcs", "", nil)
			Expect(api.Client.Create(ctx, b)).To(Succeed())
		})

		It("lets the server read the key through the API only: the Deployment holds none of it", func() {
			d := deployment(b)
			var k struct {
				PrivateKey  string `json:"private_key"`
				ClientEmail string `json:"client_email"`
			}
			Expect(json.Unmarshal(key, &k)).To(Succeed())
			Expect(deploymentHolds(d, k.PrivateKey[40:80], k.ClientEmail)).To(BeFalse())
			Expect(d.Spec.Template.Spec.InitContainers[0].Args).To(ContainElements(
				"--gcs-bucket="+bucket, "--gcs-prefix="+prefix+"/guestbackup/",
				"--credentials-secret="+veleroNS+"/"+kopiaserver.VeleroDefaultCredentialsSecret, "--credentials-key=cloud"))
			role := &rbacv1.Role{}
			Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(b)}, role)).To(Succeed())
			Expect(role.Rules[0].ResourceNames).To(ConsistOf(kopiaserver.VeleroDefaultCredentialsSecret))
		})

		It("creates a Kopia repository in the bucket, beside Velero's data, and serves a VM's user from it", func() {
			pod := runServerPod(ctx, api, binaries, b, gcs.Env()...)
			objects, err := gcs.Objects(bucket, "")
			Expect(err).NotTo(HaveOccurred())
			Expect(objects).To(ContainElement(prefix + "/guestbackup/kopia.repository"))
			Expect(objects).To(HaveEach(HavePrefix(prefix + "/guestbackup/")))
			Eventually(bslsCondition(ctx, api, b.Namespace, b.Name, v1alpha1.ConditionRepositoryReady)).WithTimeout(reconciled).Should(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Message", ContainSubstring("Velero BackupStorageLocation velero/gcs"))))
			connect(pod, b, "web")
		})
	})

	Describe("a BSLS reusing an azure BSL with a storage account key", Ordered, func() {
		const container, prefix = "velero", "cluster-z"
		var b *v1alpha1.BackupStorageLocationServer

		BeforeAll(func() {
			Expect(azurite.CreateContainer(container)).To(Succeed())
			Expect(api.Client.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "azure-credentials", Namespace: veleroNS},
				Data: map[string][]byte{"cloud": fmt.Appendf(nil, "AZURE_SUBSCRIPTION_ID=sub\nAZURE_RESOURCE_GROUP=rg\nAZURE_CLOUD_NAME=AzurePublicCloud\n%s=%s\n",
					storagecreds.AzureStorageKey, azurite.Key)},
			})).To(Succeed())
			Expect(api.Client.Create(ctx, bsl("azure", "velero.io/azure", container, prefix, map[string]any{
				"resourceGroup":           "rg",
				"storageAccount":          azurite.Account,
				"storageAccountKeyEnvVar": storagecreds.AzureStorageKey,
				"storageAccountURI":       azurite.URI(),
			}, map[string]any{"name": "azure-credentials", "key": "cloud"}))).To(Succeed())
			b = bsls(azureNS, "reuse", "azure", v1alpha1.CredentialsSecret, nil)
			Expect(api.Client.Create(ctx, b)).To(Succeed())
		})

		It("lets the server read the key through the API only: the Deployment holds none of it", func() {
			d := deployment(b)
			Expect(deploymentHolds(d, azurite.Key)).To(BeFalse())
			Expect(d.Spec.Template.Spec.InitContainers[0].Args).To(ContainElements(
				"--azure-container="+container, "--azure-storage-account="+azurite.Account, "--azure-prefix="+prefix+"/guestbackup/",
				"--azure-storage-domain="+azurite.Domain, "--azure-disable-tls",
				"--credentials-secret="+veleroNS+"/azure-credentials", "--azure-storage-key-variable="+storagecreds.AzureStorageKey))
		})

		It("creates a Kopia repository in the container, beside Velero's data, and serves a VM's user from it", func() {
			pod := runServerPod(ctx, api, binaries, b, azurite.Env()...)
			blobs, err := azurite.Blobs(container, "")
			Expect(err).NotTo(HaveOccurred())
			Expect(blobs).To(ContainElement(prefix + "/guestbackup/kopia.repository"))
			Expect(blobs).To(HaveEach(HavePrefix(prefix + "/guestbackup/")))
			Eventually(bslsCondition(ctx, api, b.Namespace, b.Name, v1alpha1.ConditionRepositoryReady)).WithTimeout(reconciled).Should(HaveField("Status", metav1.ConditionTrue))
			connect(pod, b, "db")
		})
	})

	Describe("a BSLS whose Velero BSL uses workload identity", Ordered, func() {
		const bucket, prefix = "velero-wi", "cluster-w"
		const gsa = "guestbackup@testbed.iam.gserviceaccount.com"
		var b *v1alpha1.BackupStorageLocationServer

		BeforeAll(func() {
			Expect(gcs.CreateBucket(bucket)).To(Succeed())
			// As a Velero installed with --no-secret: no credential.
			Expect(api.Client.Create(ctx, bsl("gcs-wi", "gcp", bucket, prefix, map[string]any{}, nil))).To(Succeed())
			b = bsls(wiNS, "reuse", "gcs-wi", v1alpha1.CredentialsWorkloadIdentity, map[string]string{"iam.gke.io/gcp-service-account": gsa})
			Expect(api.Client.Create(ctx, b)).To(Succeed())
		})

		It("gives the pod no static keys: no credential Secret, variable or flag, and no access to Velero's Secrets", func() {
			d := deployment(b)
			spec := d.Spec.Template.Spec
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				for _, e := range c.Env {
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
						// Guestbackup's own: the repository's and the control user's passwords.
						Expect(e.ValueFrom.SecretKeyRef.Name).To(BeElementOf(b.Name+"-repository", kopiaserver.ControlSecretName(b)), "container %s, %s", c.Name, e.Name)
					}
				}
				for _, arg := range c.Args {
					Expect(arg).NotTo(HavePrefix("--credentials-"), "container %s", c.Name)
				}
				Expect(c.VolumeMounts).To(HaveEach(HaveField("Name", BeElementOf("config", "tls"))), "container %s", c.Name)
			}
			Expect(spec.InitContainers[0].Args).To(ContainElement("--workload-identity"))
			Expect(spec.ServiceAccountName).To(Equal(kopiaserver.ServiceAccountName(b)))
			Eventually(func() (map[string]string, error) {
				sa := &corev1.ServiceAccount{}
				err := api.Client.Get(ctx, client.ObjectKey{Namespace: wiNS, Name: kopiaserver.ServiceAccountName(b)}, sa)
				return sa.Annotations, err
			}).WithTimeout(reconciled).Should(HaveKeyWithValue("iam.gke.io/gcp-service-account", gsa))
			Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(b)}, &rbacv1.Role{})).To(Satisfy(apierrors.IsNotFound))
			cur, err := getBSLS(ctx, api, wiNS, b.Name)
			Expect(err).NotTo(HaveOccurred())
			Expect(cur.Finalizers).NotTo(ContainElement(kopiaserver.FinalizerVeleroAccess), "nothing to revoke in Velero's namespace")
		})

		// On GKE, Google's client finds the ServiceAccount's identity at
		// the metadata server; here the emulator stands for Google's
		// endpoint and asks for none, so Kopia's code runs with no key.
		It("creates a Kopia repository in the bucket with no key", func() {
			runServerPod(ctx, api, binaries, b, gcs.Env()...)
			Expect(gcs.Objects(bucket, prefix+"/guestbackup/")).To(ContainElement(prefix + "/guestbackup/kopia.repository"))
		})
	})

	It("says what to fix when a Velero BSL cannot be used", func() {
		Expect(api.Client.Create(ctx, bsl("oci", "velero.io/oci", "b", "", map[string]any{}, nil))).To(Succeed())
		Expect(api.Client.Create(ctx, bsl("no-key", "gcp", "b", "", map[string]any{}, map[string]any{"name": "gcp-credentials", "key": "service-account.json"}))).To(Succeed())
		Expect(api.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "gcp-credentials", Namespace: veleroNS},
			Data:       map[string][]byte{"cloud": serviceAccountKey()},
		})).To(Succeed())
		Expect(api.Client.Create(ctx, bsl("no-secret", "azure", "b", "", map[string]any{"storageAccount": "acct"}, map[string]any{"name": "azure-sp", "key": "cloud"}))).To(Succeed())
		Expect(api.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "azure-sp", Namespace: veleroNS},
			Data:       map[string][]byte{"cloud": []byte("AZURE_TENANT_ID=t\nAZURE_CLIENT_ID=c\n")},
		})).To(Succeed())
		for _, tt := range []struct {
			name, bsl   string
			credentials v1alpha1.CredentialsSource
			reason      string
			message     string
		}{
			{"oci", "oci", "", kopiaserver.ReasonBackupStorageLocationInvalid, `its spec.provider is "velero.io/oci": guestbackup reads aws (S3 and S3-compatible storage), gcp (Google Cloud Storage) and azure (Azure Blob Storage)`},
			{"no-key", "no-key", "", kopiaserver.ReasonCredentialsInvalid, "Secret velero/gcp-credentials has no key service-account.json"},
			{"no-secret", "no-secret", "", kopiaserver.ReasonCredentialsInvalid, "Secret velero/azure-sp, key cloud, is not an Azure credentials file Kopia can use: it lacks AZURE_CLIENT_SECRET"},
			// Reading no Secret does not make Velero's bucket anyone's.
			{"no-consent", "gcs-wi", v1alpha1.CredentialsWorkloadIdentity, kopiaserver.ReasonVeleroConsentRequired, badNS + "/no-consent"},
		} {
			b := bsls(badNS, tt.name, tt.bsl, tt.credentials, nil)
			Expect(api.Client.Create(ctx, b)).To(Succeed())
			Eventually(bslsCondition(ctx, api, b.Namespace, b.Name, v1alpha1.ConditionRepositoryReady)).WithTimeout(reconciled).Should(And(Not(BeNil()),
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", tt.reason), HaveField("Message", ContainSubstring(tt.message))), tt.name)
		}
	})
})

// serviceAccountKey is a Google service account's JSON key, as Velero's gcp
// credential Secrets hold it, with a fresh RSA key.
func serviceAccountKey() []byte {
	GinkgoHelper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	Expect(err).NotTo(HaveOccurred())
	der, err := x509.MarshalPKCS8PrivateKey(k)
	Expect(err).NotTo(HaveOccurred())
	data, err := json.Marshal(map[string]string{
		"type":           "service_account",
		"project_id":     "testbed",
		"private_key_id": testbed.RandomPassword()[:16],
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   "velero-" + strings.ToLower(testbed.RandomPassword()[:6]) + "@testbed.iam.gserviceaccount.com",
		"client_id":      "1234567890",
		"token_uri":      "https://oauth2.googleapis.com/token",
	})
	Expect(err).NotTo(HaveOccurred())
	return data
}
