// Package operations proves what an admin relies on over the years, with
// the product running on the test bed (internal/local): every metric the
// chart's dashboard and alerts use is exported by the running binaries, and
// a new cluster attached to the same storage takes over (disaster
// recovery, docs/disaster-recovery.md).
//
// A cluster is a real API server with KubeVirt's control plane,
// guestbackup's webhook and controller wired as their binaries, and each
// BSLS's server pod run from the Deployment the controller writes (the
// real guestbackup-server and kopia binaries). A guest is a kopia client
// given exactly the files its bootstrap installs: the VM's Secret is
// processed by the real cloud-init and its bootcmd run under a folder, as
// the guest runs it at every boot.
package operations

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
)

// Bounds of what the product does on its own; generous, because CI's two
// cores are busy.
const (
	readyTimeout     = 2 * time.Minute
	provisionTimeout = 90 * time.Second
)

var ctx context.Context

func TestOperations(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	ctrl.SetLogger(GinkgoLogr)
	RunSpecs(t, "guestbackup over the years: metrics, alerts, disaster recovery")
}

var _ = BeforeSuite(func() { ctx = context.Background() })

// cluster is one cluster's lifetime: what local.Start and ServeBSLS
// register for cleanup runs when it is lost (close), not at the end of the
// spec, so that a spec can lose a cluster and start another on the same
// storage. Temporary folders (the repository claim) outlive it.
type cluster struct {
	testbed.TB
	// root holds every folder the cluster asks for (TempDir).
	root     string
	mu       sync.Mutex
	cleanups []func()
	*local.Platform
}

// startCluster starts a new cluster: its own API server, KubeVirt and
// guestbackup, lost when the calling node ends at the latest.
func startCluster() *cluster {
	GinkgoHelper()
	// cluster cannot skip: GinkgoT() can.
	testbed.RequireTestBed(GinkgoT())
	// The root is asked for before the caller registers lose, so Ginkgo,
	// which runs cleanups last registered first, removes it only once
	// every process of the cluster has stopped.
	c := &cluster{TB: GinkgoT(), root: GinkgoT().TempDir()}
	// Registered before it starts, so a start that fails halfway stops
	// what it started.
	DeferCleanup(c.lose)
	o := local.ControllerOptions()
	// A CA rotation's least overlap, as short as a spec can wait.
	o.CARotationMinOverlap, o.CARotationClientOverlap = 5*time.Second, 5*time.Second
	c.Platform = local.Start(c, local.Options{Logger: GinkgoLogr, Controller: &o})
	return c
}

// TempDir returns a new folder under the cluster's root. GinkgoT's own
// would be removed at the end of the node that asked for it, before lose
// when asked for after it was registered: a repository claim removed under
// a running Kopia server, which fails the removal ("directory not empty")
// as the server writes its session markers.
func (c *cluster) TempDir() string {
	GinkgoHelper()
	dir, err := os.MkdirTemp(c.root, "")
	Expect(err).NotTo(HaveOccurred())
	return dir
}

// Cleanup registers f to run when the cluster is lost.
func (c *cluster) Cleanup(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cleanups = append(c.cleanups, f)
}

// lose stops every process of the cluster, last started first; a second
// call does nothing.
func (c *cluster) lose() {
	c.mu.Lock()
	fs := c.cleanups
	c.cleanups = nil
	c.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}

// Names of the scene every spec shares.
const (
	storageNamespace = "backup"
	vmNamespace      = "team-a"
	bslsName         = "main"
	vmName           = "web"
	guestUser        = vmName + "@" + vmNamespace
)

// admitted labels the namespaces whose VMs may use the BSLS.
var admitted = map[string]string{"guestbackup.io/backup": "enabled"}

// createNamespaces creates the scene's namespaces in c.
func (c *cluster) createNamespaces() {
	GinkgoHelper()
	Expect(c.API.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: storageNamespace}})).To(Succeed())
	Expect(c.API.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vmNamespace, Labels: admitted}})).To(Succeed())
}

// newBSLS is the admin's BSLS: a filesystem repository, guests of
// admitted namespaces, reached on a loopback port (its clientURL, which
// the server's certificate names).
// startBSLS starts a cluster, lost when the calling node ends, with
// its namespaces, and returns it with a BSLS (newBSLS, not created yet)
// and the free server port it is to be served on (the client port is the
// next one).
func startBSLS() (*cluster, *v1alpha1.BackupStorageLocationServer, int) {
	GinkgoHelper()
	c := startCluster()
	c.createNamespaces()
	port, err := testbed.FreePorts(2)
	Expect(err).NotTo(HaveOccurred())
	return c, newBSLS(port), port
}

func newBSLS(port int) *v1alpha1.BackupStorageLocationServer {
	return &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: bslsName, Namespace: storageNamespace},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage:   v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access:    v1alpha1.AccessSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: admitted}},
			ClientURL: "https://127.0.0.1:" + strconv.Itoa(port),
		},
	}
}

// serve creates b in c, runs its server pod on port and waits until b is
// Ready; it returns the pod and b as the controller published it.
func (c *cluster) serve(b *v1alpha1.BackupStorageLocationServer, port int) (*testbed.Pod, *v1alpha1.BackupStorageLocationServer) {
	GinkgoHelper()
	Expect(c.API.Client.Create(ctx, b)).To(Succeed())
	pod, err := c.ServeBSLS(ctx, c, b, port)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() bool {
		Expect(c.API.Client.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
		for _, cond := range b.Status.Conditions {
			if cond.Type == v1alpha1.ConditionReady {
				return cond.Status == metav1.ConditionTrue
			}
		}
		return false
	}).WithTimeout(readyTimeout).Should(BeTrue(), "BSLS %s/%s Ready", b.Namespace, b.Name)
	return pod, b
}

// optIn creates newVM in c and returns a kopia client connected with its
// bootstrap, once the controller has provisioned its user.
func (c *cluster) optIn() *testbed.KopiaClient {
	GinkgoHelper()
	Expect(c.API.Client.Create(ctx, newVM())).To(Succeed())
	var guest *testbed.KopiaClient
	Eventually(func() error {
		var err error
		guest, err = connect(install(c.vmSecret()))
		return err
	}).WithTimeout(provisionTimeout).WithPolling(2*time.Second).Should(Succeed(), "the guest logs in with its bootstrap")
	return guest
}

// newVM is a small VM opted in to the BSLS, with no cloud-init of its
// own.
func newVM() *kubevirtv1.VirtualMachine {
	return testbed.SmallVM(vmNamespace, vmName, map[string]string{v1alpha1.AnnotationServer: storageNamespace + "/" + bslsName})
}

// vmSecret returns the VM's credential Secret in c.
func (c *cluster) vmSecret() *corev1.Secret {
	GinkgoHelper()
	return c.secretOf(vmName)
}

// secretOf returns the credential Secret of VM vm of vmNamespace in c.
func (c *cluster) secretOf(vm string) *corev1.Secret {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(c.API.Client.Get(ctx, types.NamespacedName{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName(vm)}, s)).To(Succeed())
	return s
}

// guestFiles are the files a guest's bootstrap installed.
type guestFiles struct {
	// Root is the folder they were installed under: the guest's /.
	Root string
	// URL, User and Host are guestbackup.conf's.
	URL, User, Host string
	// Password and CA are the password and trust/ca.crt files.
	Password string
	CA       []byte
}

// install does what the guest does at every boot with the Secret's
// user-data: the real cloud-init processes it, and the guestbackup bootcmd
// it yields runs under a fresh root. It returns the files it installed, and
// that root.
func install(s *corev1.Secret) guestFiles {
	GinkgoHelper()
	root := GinkgoT().TempDir()
	out, err := testbed.RunBootCmd(GinkgoT(), s.Data[v1alpha1.SecretKeyUserData], cloudinit.BootCmdMarker, root, []string{"GUESTBACKUP_ROOT=" + root})
	Expect(err).NotTo(HaveOccurred(), out)

	read := func(p string) []byte {
		GinkgoHelper()
		data, err := os.ReadFile(filepath.Join(root, p))
		Expect(err).NotTo(HaveOccurred())
		return data
	}
	f := guestFiles{Root: root, Password: string(read(cloudinit.ConfDir + "/password")), CA: read(cloudinit.TrustDir + "/ca.crt")}
	for _, line := range strings.Split(string(read(cloudinit.ConfDir+"/guestbackup.conf")), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		v = strings.Trim(v, "'")
		switch k {
		case "GUESTBACKUP_SERVER_URL":
			f.URL = v
		case "GUESTBACKUP_USER":
			f.User = v
		case "GUESTBACKUP_HOST":
			f.Host = v
		}
	}
	Expect(f.URL).NotTo(BeEmpty(), "guestbackup.conf names no server")
	return f
}

// connect connects a fresh kopia client with exactly the bootstrap's
// files, as the guest's connect script does: its URL, its user and host,
// its password, and its CA as the only trust.
func connect(f guestFiles) (*testbed.KopiaClient, error) {
	k := testbed.NewKopiaClient(GinkgoT())
	out, err := k.Connect(ctx, f.URL, f.CA, f.User+"@"+f.Host, f.Password)
	if err != nil {
		return nil, &kopiaError{err: err, out: out}
	}
	return k, nil
}

// kopiaError carries kopia's own words.
type kopiaError struct {
	err error
	out string
}

func (e *kopiaError) Error() string { return e.err.Error() + ": " + e.out }
