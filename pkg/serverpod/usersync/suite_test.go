package usersync_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/kopia/kopia/repo"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
)

const (
	namespace = "backup"
	bsls      = "main"
)

// bslsUID is the UID the syncer's Events name.
const bslsUID = "3f1c5a52-0000-4000-8000-000000000001"

var (
	apiServer *testbed.APIServer
	server    *testbed.KopiaServer
	syncer    *usersync.Syncer
	// observer is a second handle on the server's repository, as an admin
	// holding the repository password has: specs read and write the
	// repository through it, behind the syncer's back.
	observer repo.Repository
)

func TestUserSync(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	RunSpecs(t, "User sync into a real Kopia server")
}

// The suite runs the user-sync loop as a server pod does: beside a real
// kopia server, on the same repository, reading Secrets from a real API server.
var _ = BeforeSuite(func() {
	ctx := context.Background()
	apiServer = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
	Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})).To(Succeed())
	// With the file a server pod's user sync writes the gate's credentials
	// into: what guests' clients reach directly is unchanged by it.
	server = testbed.StartKopiaServer(GinkgoT(), testbed.KopiaServerOptions{Htpasswd: true})

	r, err := repo.Open(ctx, server.ConfigFile, server.RepoPassword, &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(r.Close(context.Background())).To(Succeed()) })

	observer, err = repo.Open(ctx, server.ConfigFile, server.RepoPassword, &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(observer.Close(context.Background())).To(Succeed()) })

	clientset := kubernetes.NewForConfigOrDie(apiServer.Config)
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clientset.CoreV1().Events(namespace)})
	DeferCleanup(broadcaster.Shutdown)

	syncer = usersync.New(usersync.Options{
		Client:       clientset,
		Namespace:    namespace,
		BSLS:         bsls,
		BSLSUID:      bslsUID,
		Events:       broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "guestbackup-server"}),
		Repository:   r,
		Server:       controlOf(GinkgoT(), server),
		HtpasswdFile: server.HtpasswdFile,
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

// controlOf is the server pod's control-API client of srv, as user sync
// gets it: the server-control user, trusting srv's CA.
func controlOf(tb testbed.TB, srv *testbed.KopiaServer) *serverpod.ControlClient {
	c := serverpod.NewControlClient(srv.URL, testbed.ControlUsername, srv.ControlPassword, []*x509.Certificate{srv.CA.Cert})
	tb.Cleanup(c.Close)
	return c
}
