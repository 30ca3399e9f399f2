package usersync_test

import (
	"context"
	"testing"
	"time"

	"github.com/kopia/kopia/repo"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver/usersync"
)

const (
	namespace = "backup"
	bsls      = "main"
)

var (
	apiServer *testbed.APIServer
	server    *testbed.KopiaServer
	syncer    *usersync.Syncer
)

func TestUserSync(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "User sync into a real Kopia server")
}

// The suite runs the user-sync loop as a server pod does: beside a real
// kopia server, on the same repository, reading Secrets from a real API server.
var _ = BeforeSuite(func() {
	ctx := context.Background()
	apiServer = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
	Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})).To(Succeed())
	server = testbed.StartKopiaServer(GinkgoT(), testbed.KopiaServerOptions{})

	r, err := repo.Open(ctx, server.ConfigFile, server.RepoPassword, &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(r.Close(context.Background())).To(Succeed()) })

	syncer = usersync.New(usersync.Options{
		Client:     kubernetes.NewForConfigOrDie(apiServer.Config),
		Namespace:  namespace,
		BSLS:       bsls,
		Repository: r,
		Server:     server.Control,
		// Short, so that a spec can watch a resync undo another writer's change.
		Resync: 3 * time.Second,
		Log:    GinkgoLogr,
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- syncer.Run(runCtx) }()
	DeferCleanup(func() {
		cancel()
		Eventually(done).WithTimeout(30 * time.Second).Should(Receive(BeNil()))
	})
})
