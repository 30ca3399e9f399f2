package kopiaserver_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaenv"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
)

// These specs keep repositories in a real S3 server (MinIO on loopback),
// reached the two ways a BSLS can name a bucket: spec.storage.s3 with a
// credentials Secret of its own, and a Velero BackupStorageLocation whose
// credentials stay in Velero's namespace.
var _ = Describe("S3 storage, on a real S3 server", Ordered, func() {
	const (
		// Each BSLS has a namespace of its own, so that "no Secret holds the
		// access key" means what it says for the Velero one.
		s3NS     = "s3-direct"
		veleroNS = "velero"
		reuseNS  = "s3-velero"
	)
	var (
		ctx      context.Context
		api      *testbed.APIServer
		minio    *testbed.MinIO
		binaries map[string]string
	)

	haveCondition := func(status metav1.ConditionStatus, reason, message string) OmegaMatcher {
		return And(Not(BeNil()), HaveField("Status", status), HaveField("Reason", reason), HaveField("Message", ContainSubstring(message)))
	}
	objects := func(bucket, prefix string) func() ([]string, error) {
		return func() ([]string, error) { return minio.Objects(bucket, prefix) }
	}
	runServer := func(b *v1alpha1.BackupStorageLocationServer) *testbed.Pod {
		GinkgoHelper()
		return runServerPod(ctx, api, binaries, b)
	}
	// createS3Credentials writes the MinIO's credentials into Secret name
	// of s3NS.
	createS3Credentials := func(name string) {
		GinkgoHelper()
		Expect(api.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s3NS},
			Data: map[string][]byte{
				storagecreds.AccessKeyID:     []byte(minio.AccessKeyID),
				storagecreds.SecretAccessKey: []byte(minio.SecretAccessKey),
			},
		})).To(Succeed())
	}
	// s3BSLS is BSLS name of s3NS on the MinIO's bucket under prefix, with
	// the credentials of Secret secret (createS3Credentials).
	s3BSLS := func(name, bucket, prefix, secret string) *v1alpha1.BackupStorageLocationServer {
		return &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s3NS},
			Spec: v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{S3: &v1alpha1.S3Storage{
				Bucket: bucket, Endpoint: minio.Endpoint, Region: testbed.MinIORegion, Prefix: prefix,
				CredentialsSecret: corev1.LocalObjectReference{Name: secret},
				DisableTLS:        true,
			}}},
		}
	}
	// connect connects a guest with a fresh kopia client, pinned to the
	// fingerprint the BSLS reports.
	connect := func(pod *testbed.Pod, b *v1alpha1.BackupStorageLocationServer, user, password string) func() error {
		return connectGuest(ctx, api, pod, b, user, password)
	}
	// awsCredentialsFile is what Velero's credential Secrets hold.
	awsCredentialsFile := func(profile string) []byte {
		return fmt.Appendf(nil, "[%s]\naws_access_key_id=%s\naws_secret_access_key=%s\n", profile, minio.AccessKeyID, minio.SecretAccessKey)
	}
	// awsBSL is a Velero BSL of provider aws on the MinIO, with credential
	// Secret secret of Velero's namespace.
	awsBSL := func(name, bucket, prefix, secret string) *unstructured.Unstructured {
		return veleroBSL(veleroNS, name, "aws", bucket, prefix,
			map[string]any{"region": testbed.MinIORegion, "s3Url": minio.URL, "s3ForcePathStyle": "true"},
			map[string]any{"name": secret, "key": kopiaserver.VeleroDefaultCredentialsKey},
			// The Velero admin's consent to the BSLSs of this file.
			reuseNS+"/reuse", s3NS+"/switch", reuseNS+"/no-profile")
	}

	BeforeAll(func() {
		ctx = context.Background()
		api, binaries = startStorageController(ctx, s3NS, veleroNS, reuseNS)
		minio = testbed.StartMinIO(GinkgoT())
	})

	Describe("a BSLS with spec.storage.s3", Ordered, func() {
		const (
			name   = "direct"
			bucket = "guestbackup"
			prefix = "cluster-a"
		)
		var (
			bsls *v1alpha1.BackupStorageLocationServer
			pod  *testbed.Pod
		)

		BeforeAll(func() {
			Expect(minio.CreateBucket(bucket)).To(Succeed())
			createS3Credentials("s3-credentials")
			bsls = s3BSLS(name, bucket, prefix, "s3-credentials")
			Expect(api.Client.Create(ctx, bsls)).To(Succeed())
			pod = runServer(bsls)
		})

		It("creates the repository in the bucket, under the prefix only", func() {
			Eventually(objects(bucket, "")).Should(ContainElement(prefix + "/kopia.repository"))
			keys, err := minio.Objects(bucket, "")
			Expect(err).NotTo(HaveOccurred())
			Expect(keys).To(HaveEach(HavePrefix(prefix + "/")))
		})

		It("becomes Ready, reporting where the repository is", func() {
			Eventually(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionReady)).WithTimeout(reconciled).
				Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonReady, "https://direct.s3-direct.svc:51515"))
			Expect(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionRepositoryReady)()).
				To(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonRepositoryOpened, "s3://guestbackup/cluster-a"))
		})

		It("lets a VM's user connect, pinned to status.tlsFingerprint", func() {
			password := testbed.RandomPassword()
			Expect(createCredential(ctx, api, credentialSecret("web", s3NS, s3NS, name, password, "1"))).To(Succeed())
			Eventually(connect(pod, bsls, "web@"+s3NS, password)).WithTimeout(provisioned).Should(Succeed())
			Expect(connect(pod, bsls, "web@"+s3NS, "wrong")()).To(MatchError(ContainSubstring("access denied")))
		})

		// Storage health (docs/design.md, decision 29): an outage of the storage
		// is a condition and a Warning Event while it lasts, with the
		// storage's own error, and clears on recovery. The server pod
		// checks every 10 s; the bound here is generous for CI's cores.
		It("says StorageAvailable=False with the storage's error while S3 is down, and True once it is back", func() {
			const outageSeen = 90 * time.Second
			Eventually(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionStorageAvailable)).WithTimeout(outageSeen).
				Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonStorageReachable, "reached it"))

			By("stopping MinIO")
			minio.Process.Stop()
			restarted := false
			DeferCleanup(func() {
				if !restarted {
					Expect(minio.Restart()).To(Succeed(), "MinIO back for the specs that follow")
				}
			})
			// Kopia retries a refused connection until the check's
			// timeout and then names only the timeout: the storage's
			// own words are its last attempt's.
			Eventually(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionStorageAvailable)).WithTimeout(outageSeen).
				Should(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonStorageUnavailable, "no answer within 10s"))
			Expect(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionStorageAvailable)()).
				To(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonStorageUnavailable, "the last attempt's error: "))
			Expect(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionStorageAvailable)()).
				To(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonStorageUnavailable, "connection refused"))
			Expect(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionReady)()).
				To(haveCondition(metav1.ConditionFalse, kopiaserver.ReasonNotReady, "StorageAvailable"))
			Eventually(bslsEvents(ctx, api, s3NS, name)).WithTimeout(reconciled).Should(ContainElement(
				HavePrefix("Warning " + kopiaserver.ReasonStorageUnavailable + ": StorageAvailable: The repository's storage does not answer (server pod ")))

			By("starting MinIO again")
			Expect(minio.Restart()).To(Succeed())
			restarted = true
			Eventually(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionStorageAvailable)).WithTimeout(outageSeen).
				Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonStorageReachable, "reached it"))
			Eventually(bslsCondition(ctx, api, s3NS, name, v1alpha1.ConditionReady)).WithTimeout(reconciled).
				Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonReady, ""))
			Eventually(bslsEvents(ctx, api, s3NS, name)).WithTimeout(reconciled).Should(ContainElement(
				HavePrefix("Normal " + kopiaserver.ReasonStorageReachable + ": StorageAvailable:")))
		})
	})

	Describe("a BSLS with two replicas on S3", Ordered, func() {
		const (
			name   = "scaled"
			bucket = "scaled"
		)
		var (
			bsls *v1alpha1.BackupStorageLocationServer
			pods map[string]*testbed.Pod
		)
		// holder is the pod holding the maintenance Lease.
		holder := func() (string, error) {
			lease := &coordinationv1.Lease{}
			err := api.Client.Get(ctx, types.NamespacedName{Namespace: s3NS, Name: maintenancestate.LeaseName(name)}, lease)
			if err != nil || lease.Spec.HolderIdentity == nil {
				return "", err
			}
			return *lease.Spec.HolderIdentity, nil
		}
		// nextMaintenance is what a pod's maintenance runner last scheduled;
		// 0 while it runs none.
		nextMaintenance := func(pod *testbed.Pod) func() (float64, error) {
			return func() (float64, error) {
				return testbed.Metric(pod.Addr(kopiaserver.HealthPort), "guestbackup_server_maintenance_next_run_timestamp_seconds", map[string]string{})
			}
		}

		BeforeAll(func() {
			Expect(minio.CreateBucket(bucket)).To(Succeed())
			createS3Credentials("s3-credentials-scaled")
			bsls = s3BSLS(name, bucket, "", "s3-credentials-scaled")
			bsls.Spec.Replicas = ptr.To[int32](2)
			Expect(api.Client.Create(ctx, bsls)).To(Succeed())
			d := &appsv1.Deployment{}
			Eventually(func() error {
				return api.Client.Get(ctx, types.NamespacedName{Namespace: s3NS, Name: kopiaserver.DeploymentName(bsls)}, d)
			}).WithTimeout(reconciled).Should(Succeed())
			// Two pods of the Deployment, as the ReplicaSet would start them.
			pods = map[string]*testbed.Pod{}
			for _, pod := range []string{"scaled-server-a", "scaled-server-b"} {
				pods[pod] = testbed.RunPod(GinkgoT(), testbed.PodOptions{Namespace: s3NS, Name: pod, Spec: d.Spec.Template.Spec, Binaries: binaries, API: api})
			}
			for _, pod := range pods {
				Expect(pod.WaitReady(serverReady)).To(Succeed())
			}
			markAvailable(ctx, api, d)
		})

		It("serves a user added afterwards from every replica", func() {
			password := testbed.RandomPassword()
			Expect(createCredential(ctx, api, credentialSecret("db", s3NS, s3NS, name, password, "1"))).To(Succeed())
			for _, pod := range pods {
				Eventually(connect(pod, bsls, "db@"+s3NS, password)).WithTimeout(provisioned).Should(Succeed())
				Expect(connect(pod, bsls, "db@"+s3NS, "wrong")()).To(MatchError(ContainSubstring("access denied")))
			}
		})

		// Replicas agree (docs/design.md, decision 26): each replica serves from
		// what it last read of the bucket; what one acknowledged, the
		// other lists, verifies and restores within seconds.
		It("lists, verifies and restores through each replica a snapshot written through the other", func() {
			password := testbed.RandomPassword()
			Expect(createCredential(ctx, api, credentialSecret("app", s3NS, s3NS, name, password, "1"))).To(Succeed())
			cur, err := getBSLS(ctx, api, s3NS, name)
			Expect(err).NotTo(HaveOccurred())
			clients := map[string]*testbed.KopiaClient{}
			for podName, pod := range pods {
				Eventually(connect(pod, bsls, "app@"+s3NS, password)).WithTimeout(provisioned).Should(Succeed())
				clients[podName] = testbed.NewKopiaClient(GinkgoT())
				out, err := clients[podName].ConnectPinned(ctx, "https://"+pod.Addr(v1alpha1.DefaultServerPort), cur.Status.TLSFingerprint, "app@"+s3NS, password)
				Expect(err).NotTo(HaveOccurred(), out)
			}
			for _, route := range [][2]string{{"scaled-server-a", "scaled-server-b"}, {"scaled-server-b", "scaled-server-a"}} {
				from, via := clients[route[0]], clients[route[1]]
				source := GinkgoT().TempDir()
				content := []byte("written through " + route[0] + "\n")
				Expect(os.WriteFile(filepath.Join(source, "data.txt"), content, 0o600)).To(Succeed())
				out, err := from.Run(ctx, "snapshot", "create", source)
				Expect(err).NotTo(HaveOccurred(), out)
				ids, err := from.SnapshotIDs(ctx, source)
				Expect(err).NotTo(HaveOccurred())
				Eventually(func() ([]string, error) { return via.SnapshotIDs(ctx, source) }).
					WithTimeout(45*time.Second).WithPolling(time.Second).Should(Equal(ids), "listed through %s", route[1])
				out, err = via.Run(ctx, "snapshot", "verify", "--verify-files-percent=100", ids[0])
				Expect(err).NotTo(HaveOccurred(), "verified through %s: %s", route[1], out)
				target := filepath.Join(GinkgoT().TempDir(), "restored")
				out, err = via.Run(ctx, "restore", ids[0], target)
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(os.ReadFile(filepath.Join(target, "data.txt"))).To(Equal(content), "restored through %s", route[1])
			}
		})

		It("has exactly one replica run maintenance: the one holding the Lease", func() {
			Eventually(holder).WithTimeout(reconciled).Should(BeKeyOf(pods))
			leader, err := holder()
			Expect(err).NotTo(HaveOccurred())
			Eventually(nextMaintenance(pods[leader])).WithTimeout(reconciled).Should(BeNumerically(">", 0))
			for name, pod := range pods {
				if name != leader {
					Consistently(nextMaintenance(pod)).WithTimeout(5 * time.Second).Should(BeZero())
				}
			}
			Expect(holder()).To(Equal(leader), "the Lease stays with its holder")
			Eventually(func() (string, error) {
				b, err := getBSLS(ctx, api, s3NS, name)
				if err != nil || b.Status.Maintenance == nil {
					return "", err
				}
				return b.Status.Maintenance.Owner + " " + b.Status.Maintenance.Failure, nil
			}).WithTimeout(reconciled).Should(Equal("guestbackup-maintenance@" + name + "." + s3NS + " "))
		})
	})

	// The kubelet replaces $(VAR) in a container's arguments with the
	// container's variables, and the init container holds the
	// repository's password in one. A prefix that names it must reach
	// Kopia as written: expanded, it would put the password into every
	// object name of the bucket, for whoever lists it to read.
	Describe("a BSLS whose S3 prefix names one of the server pod's variables", Ordered, func() {
		const (
			name   = "literal"
			bucket = "literal"
			prefix = "leak-$(" + kopiaenv.RepositoryPassword + ")"
		)

		It("writes the repository under the prefix as written, never the variable's value", func() {
			Expect(minio.CreateBucket(bucket)).To(Succeed())
			createS3Credentials("literal-credentials")
			b := s3BSLS(name, bucket, prefix, "literal-credentials")
			Expect(api.Client.Create(ctx, b)).To(Succeed())
			runServer(b)
			Eventually(objects(bucket, "")).WithTimeout(reconciled).Should(ContainElement(prefix + "/kopia.repository"))
			keys, err := minio.Objects(bucket, "")
			Expect(err).NotTo(HaveOccurred())
			Expect(keys).To(HaveEach(HavePrefix(prefix + "/")))
			sel := kopiaserver.RepositoryPassword(b)
			secret := &corev1.Secret{}
			Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: s3NS, Name: sel.Name}, secret)).To(Succeed())
			Expect(secret.Data[sel.Key]).NotTo(BeEmpty())
			Expect(keys).NotTo(ContainElement(ContainSubstring(string(secret.Data[sel.Key]))), "the repository's password in an object's name")
		})
	})

	Describe("a BSLS reusing a Velero BackupStorageLocation", Ordered, func() {
		const (
			name   = "reuse"
			bsl    = "minio"
			secret = "minio-credentials"
			bucket = "velero"
			prefix = "cluster-b"
		)
		var bsls *v1alpha1.BackupStorageLocationServer
		accessKey := func() client.ObjectKey {
			return client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(bsls)}
		}

		BeforeAll(func() {
			Expect(minio.CreateBucket(bucket)).To(Succeed())
			Expect(api.Client.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: veleroNS},
				Data:       map[string][]byte{kopiaserver.VeleroDefaultCredentialsKey: awsCredentialsFile("default")},
			})).To(Succeed())
			// Another Secret of Velero's, which the server must not read.
			Expect(api.Client.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: veleroNS},
				Data:       map[string][]byte{"token": []byte("not for guestbackup")},
			})).To(Succeed())
			Expect(api.Client.Create(ctx, awsBSL(bsl, bucket, prefix, secret))).To(Succeed())
			bsls = &v1alpha1.BackupStorageLocationServer{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: reuseNS},
				Spec: v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
					BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: bsl, Namespace: veleroNS},
				}},
			}
			Expect(api.Client.Create(ctx, bsls)).To(Succeed())
		})

		It("puts its finalizer, and lets the server's service account get that one Secret of Velero's", func() {
			Eventually(func() ([]string, error) {
				b, err := getBSLS(ctx, api, reuseNS, name)
				return b.Finalizers, err
			}).WithTimeout(reconciled).Should(ContainElement(kopiaserver.FinalizerVeleroAccess))
			role, binding := &rbacv1.Role{}, &rbacv1.RoleBinding{}
			Eventually(func() error { return api.Client.Get(ctx, accessKey(), binding) }).WithTimeout(reconciled).Should(Succeed())
			Expect(api.Client.Get(ctx, accessKey(), role)).To(Succeed())
			Expect(role.Rules).To(ConsistOf(rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{secret},
			}))
			Expect(binding.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}))
			Expect(binding.Subjects).To(ConsistOf(rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: kopiaserver.ServiceAccountName(bsls), Namespace: reuseNS}))

			By("asking the real API server, as the server's service account")
			sa := "system:serviceaccount:" + reuseNS + ":" + kopiaserver.ServiceAccountName(bsls)
			user, err := api.Env.AddUser(envtest.User{Name: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + reuseNS, "system:authenticated"}}, nil)
			Expect(err).NotTo(HaveOccurred())
			asServer, err := client.New(user.Config(), client.Options{Scheme: api.Scheme})
			Expect(err).NotTo(HaveOccurred())
			Eventually(func() error {
				return asServer.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: secret}, &corev1.Secret{})
			}).WithTimeout(reconciled).Should(Succeed())
			Expect(asServer.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: "other"}, &corev1.Secret{})).To(Satisfy(apierrors.IsForbidden))
			Expect(asServer.List(ctx, &corev1.SecretList{}, client.InNamespace(veleroNS))).To(Satisfy(apierrors.IsForbidden))
		})

		// Its init container reads them through the API, with no AWS_
		// variable: testdata/golden/velero-bsl.
		It("copies no credentials into the BSLS's namespace", func() {
			Eventually(func() error {
				return api.Client.Get(ctx, types.NamespacedName{Namespace: reuseNS, Name: kopiaserver.DeploymentName(bsls)}, &appsv1.Deployment{})
			}).WithTimeout(reconciled).Should(Succeed())
			secrets := &corev1.SecretList{}
			Expect(api.Client.List(ctx, secrets, client.InNamespace(reuseNS))).To(Succeed())
			Expect(secrets.Items).NotTo(BeEmpty()) // the repository password, the TLS Secrets...
			for _, s := range secrets.Items {
				for key, value := range s.Data {
					for _, credential := range []string{minio.AccessKeyID, minio.SecretAccessKey} {
						Expect(bytes.Contains(value, []byte(credential))).To(BeFalse(), "Secret %s key %s holds Velero's credentials", s.Name, key)
					}
				}
			}
		})

		Describe("once the pod it specified runs", Ordered, func() {
			var pod *testbed.Pod

			BeforeAll(func() { pod = runServer(bsls) })

			It("keeps the repository beside Velero's data, under <prefix>/guestbackup", func() {
				Eventually(objects(bucket, "")).Should(ContainElement(prefix + "/guestbackup/kopia.repository"))
				keys, err := minio.Objects(bucket, "")
				Expect(err).NotTo(HaveOccurred())
				Expect(keys).To(HaveEach(HavePrefix(prefix + "/guestbackup/")))
				Eventually(bslsCondition(ctx, api, reuseNS, name, v1alpha1.ConditionReady)).WithTimeout(reconciled).
					Should(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonReady, "https://reuse.s3-velero.svc:51515"))
				Expect(bslsCondition(ctx, api, reuseNS, name, v1alpha1.ConditionRepositoryReady)()).
					To(haveCondition(metav1.ConditionTrue, kopiaserver.ReasonRepositoryOpened, "Velero BackupStorageLocation velero/minio"))
			})

			It("lets a VM's user connect, pinned to status.tlsFingerprint", func() {
				password := testbed.RandomPassword()
				Expect(createCredential(ctx, api, credentialSecret("db", reuseNS, reuseNS, name, password, "1"))).To(Succeed())
				Eventually(connect(pod, bsls, "db@"+reuseNS, password)).WithTimeout(provisioned).Should(Succeed())
			})
		})

		It("removes its access to Velero's namespace when deleted", func() {
			Expect(api.Client.Delete(ctx, bsls)).To(Succeed())
			Eventually(func() error {
				_, err := getBSLS(ctx, api, reuseNS, name)
				return err
			}).WithTimeout(reconciled).Should(Satisfy(apierrors.IsNotFound), "the finalizer is removed")
			Expect(api.Client.Get(ctx, accessKey(), &rbacv1.Role{})).To(Satisfy(apierrors.IsNotFound))
			Expect(api.Client.Get(ctx, accessKey(), &rbacv1.RoleBinding{})).To(Satisfy(apierrors.IsNotFound))
			// envtest runs no garbage collector: what the BSLS owned stays.
		})
	})

	It("keeps the repository at the bucket's root when the BSLS names no prefix", func() {
		const bucket = "no-prefix"
		Expect(minio.CreateBucket(bucket)).To(Succeed())
		b := s3BSLS("no-prefix", bucket, "", "s3-credentials")
		Expect(api.Client.Create(ctx, b)).To(Succeed())
		runServer(b)
		Expect(objects(bucket, "")()).To(ContainElement("kopia.repository"))
	})

	// MinIO cleans a leading "/" from keys, so the spec above cannot tell
	// whether Kopia was given "/" as prefix (AWS S3 keeps
	// "/kopia.repository" as given): testdata/golden/s3-no-prefix can.

	// Otherwise the server's service account would keep reading Velero's
	// credentials after the switch.
	It("removes its access to Velero's namespace when the BSLS stops using the Velero BSL", func() {
		b := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "switch", Namespace: s3NS},
			Spec: v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
				BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: "minio", Namespace: veleroNS},
			}},
		}
		Expect(api.Client.Create(ctx, b)).To(Succeed())
		access := client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(b)}
		Eventually(func() error { return api.Client.Get(ctx, access, &rbacv1.RoleBinding{}) }).WithTimeout(reconciled).Should(Succeed())

		By("switching the BSLS to S3 storage of its own")
		Eventually(func() error {
			cur, err := getBSLS(ctx, api, s3NS, b.Name)
			if err != nil {
				return err
			}
			cur.Spec.Storage = s3BSLS("", "guestbackup", "switched", "s3-credentials").Spec.Storage
			return api.Client.Update(ctx, cur)
		}).WithTimeout(reconciled).Should(Succeed())
		// The binding goes first, then the Role: wait for both.
		Eventually(func() error { return api.Client.Get(ctx, access, &rbacv1.RoleBinding{}) }).WithTimeout(reconciled).Should(Satisfy(apierrors.IsNotFound))
		Eventually(func() error { return api.Client.Get(ctx, access, &rbacv1.Role{}) }).WithTimeout(reconciled).Should(Satisfy(apierrors.IsNotFound))
		Eventually(func() ([]string, error) {
			cur, err := getBSLS(ctx, api, s3NS, b.Name)
			return cur.Finalizers, err
		}).WithTimeout(reconciled).ShouldNot(ContainElement(kopiaserver.FinalizerVeleroAccess))
	})

	It("refuses a Velero BSL whose credential Secret lacks the profile, naming the Secret and key", func() {
		const name = "no-profile"
		Expect(api.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "other-profile", Namespace: veleroNS},
			Data:       map[string][]byte{kopiaserver.VeleroDefaultCredentialsKey: awsCredentialsFile("backup")},
		})).To(Succeed())
		Expect(api.Client.Create(ctx, awsBSL("other-profile", "velero", "cluster-c", "other-profile"))).To(Succeed())
		b := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: reuseNS},
			Spec: v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
				BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: "other-profile", Namespace: veleroNS},
			}},
		}
		Expect(api.Client.Create(ctx, b)).To(Succeed())
		Eventually(bslsCondition(ctx, api, reuseNS, name, v1alpha1.ConditionRepositoryReady)).WithTimeout(reconciled).Should(haveCondition(
			metav1.ConditionFalse, kopiaserver.ReasonCredentialsInvalid, "Secret velero/other-profile, key cloud, is not an AWS credentials file Kopia can use: no profile [default]"))
		Expect(strings.Contains(bslsCondition(ctx, api, reuseNS, name, v1alpha1.ConditionRepositoryReady)().Message, minio.SecretAccessKey)).To(BeFalse())

		By("granting nothing in Velero's namespace and starting no server")
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(b)}, &rbacv1.Role{})).To(Satisfy(apierrors.IsNotFound))
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: reuseNS, Name: kopiaserver.DeploymentName(b)}, &appsv1.Deployment{})).To(Satisfy(apierrors.IsNotFound))

		By("noticing at once when the Velero BSL is pointed at the profile: the controller watches Velero's objects")
		bsl := &unstructured.Unstructured{}
		bsl.SetGroupVersionKind(kopiaserver.VeleroBSL)
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: "other-profile"}, bsl)).To(Succeed())
		Expect(unstructured.SetNestedField(bsl.Object, "backup", "spec", "config", "profile")).To(Succeed())
		Expect(api.Client.Update(ctx, bsl)).To(Succeed())
		// Well within the 30 s retry of a BSLS with a problem.
		Eventually(func() string {
			return bslsCondition(ctx, api, reuseNS, name, v1alpha1.ConditionRepositoryReady)().Reason
		}).
			WithTimeout(10 * time.Second).ShouldNot(Equal(kopiaserver.ReasonCredentialsInvalid))
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(b)}, &rbacv1.Role{})).To(Succeed())
	})

	// With names joined by a dash, s3/velero-no-profile and
	// s3-velero/no-profile shared their Role in Velero's namespace, and
	// the first, refused for want of consent, deleted the second's.
	It("revokes only its own access, however alike two BSLSs' names read", func() {
		victim := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "no-profile", Namespace: reuseNS}}
		victimAccess := client.ObjectKey{Namespace: veleroNS, Name: kopiaserver.VeleroAccessName(victim)}
		Expect(api.Client.Get(ctx, victimAccess, &rbacv1.RoleBinding{})).To(Succeed())

		Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "s3"}})).To(Succeed())
		alike := &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "velero-no-profile", Namespace: "s3"},
			Spec: v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
				BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Name: "other-profile", Namespace: veleroNS},
			}},
		}
		Expect(kopiaserver.VeleroAccessName(alike)).NotTo(Equal(victimAccess.Name))
		Expect(api.Client.Create(ctx, alike)).To(Succeed())
		Eventually(bslsCondition(ctx, api, "s3", alike.Name, v1alpha1.ConditionRepositoryReady)).
			WithTimeout(reconciled).Should(HaveField("Reason", kopiaserver.ReasonVeleroConsentRequired))

		Expect(api.Client.Get(ctx, victimAccess, &rbacv1.RoleBinding{})).To(Succeed(), "the consented BSLS keeps its RoleBinding")
		Expect(api.Client.Get(ctx, victimAccess, &rbacv1.Role{})).To(Succeed(), "the consented BSLS keeps its Role")
	})
})

// serverReady bounds a server pod's start: its init container creates
// the repository in the storage.
const serverReady = 3 * time.Minute

// runServerPod runs b's server pod from the Deployment the controller
// wrote, as the kubelet would, and reports the Deployment available. env
// (NAME=value) is added to every container: what a cloud gives its pods
// and the test bed plays, such as an emulator's address.
func runServerPod(ctx context.Context, api *testbed.APIServer, binaries map[string]string, b *v1alpha1.BackupStorageLocationServer, env ...string) *testbed.Pod {
	GinkgoHelper()
	d := &appsv1.Deployment{}
	Eventually(func() error {
		return api.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: kopiaserver.DeploymentName(b)}, d)
	}).WithTimeout(reconciled).Should(Succeed())
	spec := *d.Spec.Template.Spec.DeepCopy()
	for _, containers := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range containers {
			for _, e := range env {
				name, value, _ := strings.Cut(e, "=")
				containers[i].Env = append(containers[i].Env, corev1.EnvVar{Name: name, Value: value})
			}
		}
	}
	pod := testbed.RunPod(GinkgoT(), testbed.PodOptions{Namespace: b.Namespace, Spec: spec, Binaries: binaries, API: api})
	Expect(pod.WaitReady(serverReady)).To(Succeed())
	markAvailable(ctx, api, d)
	return pod
}

// connectGuest connects a guest with a fresh kopia client, pinned to the
// fingerprint b reports.
func connectGuest(ctx context.Context, api *testbed.APIServer, pod *testbed.Pod, b *v1alpha1.BackupStorageLocationServer, user, password string) func() error {
	return func() error {
		cur := &v1alpha1.BackupStorageLocationServer{}
		if err := api.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Name}, cur); err != nil {
			return err
		}
		if cur.Status.TLSFingerprint == "" {
			return fmt.Errorf("BSLS %s/%s reports no tlsFingerprint yet", b.Namespace, b.Name)
		}
		out, err := testbed.NewKopiaClient(GinkgoT()).ConnectPinned(ctx, "https://"+pod.Addr(v1alpha1.DefaultServerPort), cur.Status.TLSFingerprint, user, password)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
}
