package kubevirt

import (
	"context"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/test/story"
)

// A GitOps sync or a VM pool creates VMs back to back. Each new VM's
// Secret waits for its hash, so the real BSLS reconciler flips the BSLS's
// Ready to False (UsersSynced) and back for each: nothing of that may
// refuse a VM.
var _ = Describe("A pool of VMs created back to back against a real server", Ordered, func() {
	const pool = 20
	var (
		ctx      context.Context
		platform *local.Platform
		bsls     *v1alpha1.BackupStorageLocationServer
	)

	BeforeAll(func() {
		ctx = context.Background()
		port, err := testbed.FreePorts(2)
		Expect(err).NotTo(HaveOccurred())
		platform = local.Start(GinkgoT(), local.Options{Logger: GinkgoLogr})
		for _, ns := range []string{"backup", "team-a"} {
			Expect(platform.API.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"backup": "allowed"}}})).To(Succeed())
		}
		bsls = &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"},
			Spec: v1alpha1.BackupStorageLocationServerSpec{
				Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
				Access:  v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"backup": "allowed"}}},
			},
		}
		Expect(platform.API.Client.Create(ctx, bsls)).To(Succeed())
		_, err = platform.ServeBSLS(ctx, GinkgoT(), bsls, port)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() bool {
			_ = platform.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), bsls)
			return meta.IsStatusConditionTrue(bsls.Status.Conditions, v1alpha1.ConditionReady)
		}).WithTimeout(time.Minute).Should(BeTrue())
	})

	It("admits every VM, and provisions them all", func() {
		for i := range pool {
			name := "pool-" + strconv.Itoa(i)
			Expect(platform.API.Client.Create(ctx, optIn(story.TypicalVM(name), "team-a", "backup/main"))).To(Succeed(), name)
		}
		for i := range pool {
			user := identity.OfVM("pool-"+strconv.Itoa(i), "team-a")
			Eventually(func() string {
				s := &corev1.Secret{}
				_ = platform.API.Client.Get(ctx, client.ObjectKey{Namespace: "backup", Name: userset.SecretName("main", userset.ShardOf(user))}, s)
				return string(s.Data[userset.Key])
			}).WithTimeout(time.Minute).Should(ContainSubstring(user))
		}
	})
})
