package scale

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// VMsEnv sets how many opted-in VMs BenchmarkOptedInVMs puts in the API
// server; the default keeps `make bench` to a couple of minutes, 10000 is
// the figure docs/operations.md quotes (about 15 minutes on 2 cores).
const VMsEnv = "GUESTBACKUP_BENCH_VMS"

// ProfilesEnv names a directory BenchmarkOptedInVMs writes the settled
// controller's and the webhook's heap profiles to (controller-heap.pprof,
// webhook-heap.pprof; read them with `go tool pprof`): where their memory
// goes. Unset, the binaries serve no profiles.
const ProfilesEnv = "GUESTBACKUP_BENCH_PROFILES"

const (
	// controllerNamespace is where the binaries run, as the chart installs
	// them.
	controllerNamespace = "guestbackup-system"
	// vmsPerNamespace spreads the VMs over tenant namespaces.
	vmsPerNamespace = 100
	// settled bounds how long a controller may take to settle (sync-s).
	settled = 20 * time.Minute
)

var fleetServer = types.NamespacedName{Namespace: "backup", Name: "main"}

// BenchmarkOptedInVMs runs cmd/controller and cmd/webhook, built as they
// ship and each a process of its own with the chart's RBAC, against a real
// API server holding N opted-in VMs (N from GUESTBACKUP_BENCH_VMS, default
// 1000), each as a cluster would hold it once guestbackup settled: the VM
// as the webhook admitted it (mutate.Decide on a typical VM with its own
// cloud-config and kubectl's last-applied copy), its credential Secret as
// the webhook wrote it (the real payload) and the controller adopted,
// hashed and announced it, a running instance, and its guest's last
// snapshot in the server's activity ConfigMaps, announced. The VMs are
// created straight into the API server (no KubeVirt webhook), and every
// Secret carries one real PBKDF2 hash: hashing N passwords is what the
// benchmark checks the controller never does again.
//
// It reports:
//   - sync-s: from the controller's start to every user in its server's
//     users Secrets (which the benchmark leaves empty) and every VM
//     reconciled, queues empty;
//   - restart-s: the same after a restart, the users Secrets in place;
//   - rehashes: passwords the controller hashed in both
//     (guestbackup_password_hashes_total), which must be 0;
//   - sync-writes and restart-writes: the API writes the controller sent
//     until settled (client-go's rest_client_requests_total, POST, PUT,
//     PATCH and DELETE): the users Secrets and each VM's GuestProtection
//     at the first sync; a settled fleet should cost next to none;
//   - controller-RSS-MB, controller-peak-MB (VmHWM: its start included)
//     and controller-heap-MB (the Go heap in use) once settled after the
//     restart, controller-idle-RSS-MB without VMs; webhook-RSS-MB,
//     webhook-peak-MB and webhook-heap-MB with its caches synced (after an
//     admission), webhook-idle-RSS-MB before;
//   - admission-p50-ms and admission-p99-ms: a VM's re-admission over
//     HTTPS with N VMs cached.
func BenchmarkOptedInVMs(b *testing.B) {
	n := 1000
	if v := os.Getenv(VMsEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("%s=%q: want a positive count", VMsEnv, v)
		}
	}
	// The benchmark's own clients log nothing worth reading.
	ctrllog.SetLogger(logr.Discard())
	ctx := context.Background()
	f := newFleet(b, n)

	// The controller publishes the server's endpoint and CA, which the
	// webhook renders every payload with.
	first := f.startController(b, "controller-idle")
	bsls := f.published(b, first)
	idle := mib(first.rss(b))
	first.stop()

	f.seed(ctx, b, bsls)

	// No users Secret holds a user yet: the controller writes them all
	// from the hashes in the Secrets.
	f.emptyUsers(ctx, b)
	sync := f.startController(b, "controller-sync")
	syncTime := sync.settle(b, f)
	syncHashes := sync.hashes(b)
	syncWrites := sync.writes(b)
	sync.stop()

	var restartTime time.Duration
	var restart *process
	for b.Loop() {
		if restart != nil {
			restart.stop() // one replica at a time
		}
		restart = f.startController(b, "controller-restart")
		restartTime = restart.settle(b, f)
	}
	rehashes := syncHashes + restart.hashes(b)
	restartWrites := restart.writes(b)
	restart.logReconcileTimes(b)
	controllerRSS, controllerPeak, controllerHeap := restart.rss(b), restart.peak(b), restart.heap(b)
	// After the figures: a profile collects first (?gc=1), which would
	// leave only the live heap for them to measure.
	restart.writeHeapProfile(b, "controller")

	wh := f.startWebhook(b)
	webhookIdle := mib(wh.rss(b))
	p50, p99 := wh.admissions(b, f, 200)
	webhookRSS, webhookPeak, webhookHeap := wh.rss(b), wh.peak(b), wh.heap(b)
	wh.writeHeapProfile(b, "webhook")

	b.ReportMetric(float64(n), "VMs")
	b.ReportMetric(syncTime.Seconds(), "sync-s")
	b.ReportMetric(restartTime.Seconds(), "restart-s")
	b.ReportMetric(rehashes, "rehashes")
	b.ReportMetric(syncWrites, "sync-writes")
	b.ReportMetric(restartWrites, "restart-writes")
	b.ReportMetric(idle, "controller-idle-RSS-MB")
	b.ReportMetric(mib(controllerRSS), "controller-RSS-MB")
	b.ReportMetric(mib(controllerPeak), "controller-peak-MB")
	b.ReportMetric(controllerHeap, "controller-heap-MB")
	b.ReportMetric(webhookIdle, "webhook-idle-RSS-MB")
	b.ReportMetric(mib(webhookRSS), "webhook-RSS-MB")
	b.ReportMetric(mib(webhookPeak), "webhook-peak-MB")
	b.ReportMetric(webhookHeap, "webhook-heap-MB")
	b.ReportMetric(float64(p50.Microseconds())/1000, "admission-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "admission-p99-ms")
	if rehashes != 0 {
		b.Errorf("the controller hashed %v passwords again", rehashes)
	}
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// fleet is the API server and what the benchmark put in it.
type fleet struct {
	api *testbed.APIServer
	// c writes without client-side rate limits.
	c          client.Client
	n          int
	namespaces []string
	binaries   map[string]string
	// kubeconfigs are the binaries' accounts, by component.
	kubeconfigs map[string]string
	// hash is the one hash every Secret carries.
	hash identity.Hash
	// sample is a VM as admitted, for the webhook's admissions.
	sample []byte
}

func newFleet(b *testing.B, n int) *fleet {
	b.Helper()
	ctx := context.Background()
	api := testbed.StartAPIServer(b, testbed.APIServerOptions{})
	cfg := rest.CopyConfig(api.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	c, err := client.New(cfg, client.Options{Scheme: api.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	f := &fleet{api: api, c: c, n: n, binaries: map[string]string{}, kubeconfigs: map[string]string{}}
	for _, ns := range []string{controllerNamespace, fleetServer.Namespace} {
		f.create(ctx, b, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for _, cmd := range []string{"controller", "webhook"} {
		f.binaries[cmd] = testbed.Build(b, "./cmd/"+cmd)
		f.kubeconfigs[cmd] = f.account(ctx, b, cmd)
	}
	for i := 0; i*vmsPerNamespace < n; i++ {
		ns := fmt.Sprintf("team-%03d", i)
		f.namespaces = append(f.namespaces, ns)
		f.create(ctx, b, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"guestbackup.io/backup": "enabled"}}})
	}
	f.create(ctx, b, &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Namespace: fleetServer.Namespace, Name: fleetServer.Name},
		Spec: v1alpha1.BackupStorageLocationServerSpec{
			Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}},
			Access: v1alpha1.AccessSpec{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"guestbackup.io/backup": "enabled"}},
				PasswordHash:      v1alpha1.PasswordHashPBKDF2,
			},
		},
	})
	if f.hash, err = identity.NewHash(testbed.RandomPassword(), identity.PBKDF2); err != nil {
		b.Fatal(err)
	}
	return f
}

func (f *fleet) create(ctx context.Context, b *testing.B, obj client.Object) {
	b.Helper()
	if err := f.c.Create(ctx, obj); err != nil {
		b.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// account runs a binary as its ServiceAccount with the ClusterRole
// controller-gen writes for it (config/rbac), and returns its kubeconfig.
func (f *fleet) account(ctx context.Context, b *testing.B, component string) string {
	b.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", component, "role.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(bytes.TrimPrefix(data, []byte("---\n")), role); err != nil {
		b.Fatal(err)
	}
	user := "system:serviceaccount:" + controllerNamespace + ":guestbackup-" + component
	f.create(ctx, b, role)
	f.create(ctx, b, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
	})
	authn, err := f.api.Env.AddUser(envtest.User{Name: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + controllerNamespace}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	kubeconfig, err := authn.KubeConfig()
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), component+".kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// process is a binary of guestbackup's running, with its metrics on
// loopback.
type process struct {
	*testbed.Process
	metrics string
	// pprof serves the binary's profiles, when ProfilesEnv asks for them.
	pprof   string
	started time.Time
	// port is the webhook's HTTPS port, roots its CA.
	port  int
	roots *x509.CertPool
}

// startAttempts bounds how often a binary is started again because a port
// picked free was taken before it bound it (other processes of the host
// pick ports too).
const startAttempts = 3

func freePort(b *testing.B) int {
	b.Helper()
	port, err := testbed.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	return port
}

// start starts a binary with its metrics and health probes on loopback
// ports, and args and the ports ports(p) picks for it, and waits until it
// serves its metrics.
func (f *fleet) start(b *testing.B, name, component string, args []string, ports func(p *process) []string) *process {
	b.Helper()
	for attempt := 1; ; attempt++ {
		p := &process{metrics: "127.0.0.1:" + strconv.Itoa(freePort(b)), started: time.Now()}
		all := append([]string{"--metrics-bind-address=" + p.metrics, "--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(freePort(b))}, args...)
		if os.Getenv(ProfilesEnv) != "" {
			p.pprof = "127.0.0.1:" + strconv.Itoa(freePort(b))
			all = append(all, "--pprof-bind-address="+p.pprof)
		}
		if ports != nil {
			all = append(all, ports(p)...)
		}
		p.Process = testbed.StartProcess(b, testbed.ProcessSpec{
			Name: fmt.Sprintf("%s-%d", name, attempt), Path: f.binaries[component], Args: all,
			Env: []string{"KUBECONFIG=" + f.kubeconfigs[component]},
		})
		err := p.waitFor(time.Minute, 100*time.Millisecond, func() (bool, error) {
			_, err := testbed.Scrape(p.metrics)
			return err == nil, err
		})
		if err == nil {
			return p
		}
		if attempt == startAttempts || !strings.Contains(p.Log(), "address already in use") {
			b.Fatalf("%s does not serve its metrics: %v", name, err)
		}
		b.Logf("%s: a port was taken before it bound it; starting it again", name)
	}
}

// waitFor polls cond every interval until it holds, for at most timeout,
// and gives up at once if the process exits: a binary that died never
// settles. The error is cond's last one, or the exit.
func (p *process) waitFor(timeout, interval time.Duration, cond func() (bool, error)) error {
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), interval, timeout, true, func(context.Context) (bool, error) {
		if done, err := p.Exited(); done {
			return false, fmt.Errorf("%s exited (%v)", p.Spec.Name, err)
		}
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil && last != nil && wait.Interrupted(err) {
		return fmt.Errorf("not ready after %v: %w", timeout, last)
	}
	return err
}

// startController starts cmd/controller as the chart does, without leader
// election (one replica).
func (f *fleet) startController(b *testing.B, name string) *process {
	b.Helper()
	return f.start(b, name, "controller", []string{"--namespace=" + controllerNamespace, "--server-image=guestbackup:bench", "--leader-elect=false"}, nil)
}

func (p *process) stop() { p.Stop() }

// writeHeapProfile writes the process's heap profile, after a collection,
// to ProfilesEnv's directory as name-heap.pprof, if it names one.
func (p *process) writeHeapProfile(b *testing.B, name string) {
	b.Helper()
	dir := os.Getenv(ProfilesEnv)
	if dir == "" {
		return
	}
	resp, err := http.Get("http://" + p.pprof + "/debug/pprof/heap?gc=1")
	if err != nil {
		b.Fatalf("profile %s: %v", name, err)
	}
	defer resp.Body.Close()
	profile, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("profile %s: %s %v", name, resp.Status, err)
	}
	path := filepath.Join(dir, name+"-heap.pprof")
	if err := os.WriteFile(path, profile, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s's heap profile: %s", name, path)
}

func (p *process) rss(b *testing.B) int64 {
	b.Helper()
	v, err := p.RSS()
	if err != nil {
		b.Fatal(err)
	}
	return v
}

func (p *process) peak(b *testing.B) int64 {
	b.Helper()
	v, err := p.PeakRSS()
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// published waits for the controller to publish the server's endpoint and
// CA, and returns the BSLS.
func (f *fleet) published(b *testing.B, controller *process) *v1alpha1.BackupStorageLocationServer {
	b.Helper()
	bsls := &v1alpha1.BackupStorageLocationServer{}
	err := controller.waitFor(5*time.Minute, 200*time.Millisecond, func() (bool, error) {
		err := f.c.Get(context.Background(), fleetServer, bsls)
		return err == nil && bsls.Status.Endpoint != "" && bsls.Status.TLSCA != "", err
	})
	if err != nil {
		b.Fatalf("the controller published no endpoint and CA: %v", err)
	}
	return bsls
}

// typicalVM is a VM as its owner writes it: a container disk, a network,
// its own cloud-config (an admin user and a key), guestbackup's opt-in and
// paths, applied with kubectl (its last-applied copy).
func typicalVM(name, namespace string) *kubevirtv1.VirtualMachine {
	vm := &kubevirtv1.VirtualMachine{
		TypeMeta: metav1.TypeMeta{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, Labels: map[string]string{"app": name},
			Annotations: map[string]string{v1alpha1.AnnotationServer: fleetServer.String(), v1alpha1.AnnotationPaths: "/etc,/home"},
		},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io/domain": name}},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						CPU:    &kubevirtv1.CPU{Cores: 2},
						Memory: &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("2Gi"))},
						Devices: kubevirtv1.Devices{
							Disks: []kubevirtv1.Disk{
								{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
								{Name: "cloudinit", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
							},
							Interfaces: []kubevirtv1.Interface{{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
					Volumes: []kubevirtv1.Volume{
						{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/debian:12"}}},
						{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{
							UserData: "#cloud-config\nusers:\n  - name: admin\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    ssh_authorized_keys:\n      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ3rWz8vYgq2lN5o3JmQfU2yXk0VbPp9sXgR1tK7hL4m admin@" + name + "\npackage_update: true\npackages: [qemu-guest-agent]\n",
						}}},
					},
				},
			},
		},
	}
	applied, _ := json.Marshal(vm) // typed: cannot fail
	vm.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = string(applied)
	return vm
}

// admit is what the webhook makes of vm: the VM it patched, its Secret.
func admit(b testing.TB, vm *kubevirtv1.VirtualMachine, bsls *v1alpha1.BackupStorageLocationServer) ([]byte, *corev1.Secret) {
	b.Helper()
	raw, err := json.Marshal(vm)
	if err != nil {
		b.Fatal(err)
	}
	d, err := mutate.Decide(mutate.Input{
		Object: raw, Namespace: vm.Namespace, Server: mutate.Server{BSLS: bsls, NamespaceAllowed: true},
		NewPassword: mutate.NewPassword, Now: time.Now(),
	})
	if err != nil || d.Denied != "" || d.Secret == nil {
		b.Fatalf("the webhook did not inject %s: %v %s", vm.Name, err, d.Denied)
	}
	admitted, err := testbed.ApplyPatch(raw, d.Patch)
	if err != nil {
		b.Fatal(err)
	}
	return admitted, d.Secret
}

// instanceOf is vm's running instance, as virt-controller and virt-handler
// keep it.
func instanceOf(vm *kubevirtv1.VirtualMachine, node string, started time.Time) *kubevirtv1.VirtualMachineInstance {
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(started.Add(d)) }
	return &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name: vm.Name, Namespace: vm.Namespace,
			Labels: map[string]string{"kubevirt.io/domain": vm.Name, "kubevirt.io/nodeName": node},
			Annotations: map[string]string{
				"kubevirt.io/latest-observed-api-version": "v1", "kubevirt.io/storage-observed-api-version": "v1", "kubevirt.io/vm-generation": "1",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			Finalizers:      []string{"kubevirt.io/virtualMachineControllerFinalize", "foregroundDeleteVirtualMachine"},
		},
		Spec: vm.Spec.Template.Spec,
		Status: kubevirtv1.VirtualMachineInstanceStatus{
			Phase: kubevirtv1.Running, NodeName: node, QOSClass: ptr.To(corev1.PodQOSBurstable),
			LauncherContainerImageVersion: "quay.io/kubevirt/virt-launcher:v1.8.1",
			PhaseTransitionTimestamps: []kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{
				{Phase: kubevirtv1.Pending, PhaseTransitionTimestamp: at(0)}, {Phase: kubevirtv1.Scheduling, PhaseTransitionTimestamp: at(time.Second)},
				{Phase: kubevirtv1.Scheduled, PhaseTransitionTimestamp: at(5 * time.Second)}, {Phase: kubevirtv1.Running, PhaseTransitionTimestamp: at(9 * time.Second)},
			},
			Conditions: []kubevirtv1.VirtualMachineInstanceCondition{
				{Type: kubevirtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: at(9 * time.Second)},
				{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue},
				{Type: kubevirtv1.VirtualMachineInstanceAgentConnected, Status: corev1.ConditionTrue, LastTransitionTime: at(40 * time.Second)},
			},
			Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{
				Name: "default", IP: "10.244.1.17", IPs: []string{"10.244.1.17"}, MAC: "52:54:00:4e:1f:2a", InterfaceName: "enp1s0", InfoSource: "domain, guest-agent",
			}},
			GuestOSInfo: kubevirtv1.VirtualMachineInstanceGuestOSInfo{Name: "Debian GNU/Linux", ID: "debian", Version: "12 (bookworm)", VersionID: "12", KernelRelease: "6.1.0-27-cloud-amd64"},
			VolumeStatus: []kubevirtv1.VolumeStatus{
				{Name: "root", Target: "vda"}, {Name: "cloudinit", Target: "vdb", Size: 1048576}, {Name: mutate.CloudInitVolume, Target: "vdc", Size: 1048576},
			},
		},
	}
}

// seed creates the fleet's VMs, Secrets and instances, and its guests'
// activity and catalogues, as they are once guestbackup settled.
func (f *fleet) seed(ctx context.Context, b *testing.B, bsls *v1alpha1.BackupStorageLocationServer) {
	b.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	start := time.Now()
	guests := make([]activity.Guest, f.n)
	work := make(chan int)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(work)
		for i := range f.n {
			select {
			case work <- i:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range 16 {
		g.Go(func() error {
			for i := range work {
				guest, err := f.seedVM(gctx, b, bsls, i, start)
				if err != nil {
					return err
				}
				guests[i] = guest
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatalf("seed %d VMs: %v", f.n, err)
	}
	shards := make([]map[string]activity.Guest, userset.Shards)
	for i := range shards {
		shards[i] = map[string]activity.Guest{}
	}
	for _, guest := range guests {
		shards[userset.ShardOf(guest.User)][guest.User] = guest
	}
	for shard, guests := range shards {
		cm := &corev1.ConfigMap{}
		key := types.NamespacedName{Namespace: fleetServer.Namespace, Name: activity.ConfigMapName(fleetServer.Name, shard)}
		if err := f.c.Get(ctx, key, cm); err != nil {
			b.Fatalf("the controller made no activity ConfigMap %s: %v", key, err)
		}
		cm.Data = map[string]string{activity.Key: string(activity.Encode(guests))}
		if err := f.c.Update(ctx, cm); err != nil {
			b.Fatal(err)
		}
	}
	// Each guest's catalogue: its ten newest, hourly before the last.
	catalogues := make([]map[string][]activity.Snapshot, activity.CatalogueShards)
	for i := range catalogues {
		catalogues[i] = map[string][]activity.Snapshot{}
	}
	for i, guest := range guests {
		var snaps []activity.Snapshot
		for h := range v1alpha1.MaxRecentSnapshots {
			s := guest.Last
			if h > 0 {
				s.ID = fmt.Sprintf("k%015x%016x", h, i)
				s.Start, s.End = s.Start.Add(-time.Duration(h)*time.Hour), s.End.Add(-time.Duration(h)*time.Hour)
			}
			snaps = append(snaps, s)
		}
		catalogues[activity.CatalogueShardOf(guest.User)][guest.User] = activity.Newest(guest.User, snaps)
	}
	for shard, c := range catalogues {
		cm := &corev1.ConfigMap{}
		key := types.NamespacedName{Namespace: fleetServer.Namespace, Name: activity.CatalogueConfigMapName(fleetServer.Name, shard)}
		if err := f.c.Get(ctx, key, cm); err != nil {
			b.Fatalf("the controller made no catalogue ConfigMap %s: %v", key, err)
		}
		cm.Data = map[string]string{activity.CatalogueKey: string(activity.EncodeCatalogues(c))}
		if err := f.c.Update(ctx, cm); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d VMs, Secrets and instances in %s", f.n, time.Since(start).Round(time.Second))
}

// seedVM creates VM i as the webhook admitted it, its Secret as the
// controller keeps it, and its instance, and returns its guest's activity.
func (f *fleet) seedVM(ctx context.Context, b *testing.B, bsls *v1alpha1.BackupStorageLocationServer, i int, now time.Time) (activity.Guest, error) {
	ns := f.namespaces[i/vmsPerNamespace]
	name := fmt.Sprintf("vm-%05d", i)
	admitted, secret := admit(b, typicalVM(name, ns), bsls)
	vm := &kubevirtv1.VirtualMachine{}
	if err := json.Unmarshal(admitted, vm); err != nil {
		return activity.Guest{}, err
	}
	if err := f.c.Create(ctx, vm); err != nil {
		return activity.Guest{}, fmt.Errorf("create VM %s/%s: %w", ns, name, err)
	}
	if i == 0 {
		f.sample = admitted
	}
	// As the controller leaves it: adopted, hashed, its issue recorded
	// and its user's provisioning announced.
	secret.OwnerReferences = []metav1.OwnerReference{vmsecret.OwnerReference(vm.Name, vm.UID)}
	vmsecret.SetPasswordHash(secret, f.hash.String())
	delete(secret.Annotations, vmsecret.AnnotationIssuedEvent)
	vmsecret.SetAnnounced(secret, fleetServer.String(), vmsecret.Generation(secret))
	user := vmsecret.Identity(secret)
	snapshot := now.Add(-time.Duration(i%3600) * time.Second)
	guest := activity.Guest{User: user, Snapshots: 24, First: now.Add(-24 * time.Hour), Last: activity.Snapshot{
		ID: fmt.Sprintf("k%031x", i), Path: "/etc", Start: snapshot.Add(-7 * time.Second), End: snapshot, Bytes: 48_213_004, Files: 1732,
	}}
	// What the audit announced of it (its own decision on this guest).
	for k, v := range audit.Decide(vm.Annotations, secret.Annotations, &guest, vmsecret.IssuedAt(secret), now, audit.DefaultStaleAfter).Annotations {
		if v != "" {
			secret.Annotations[k] = v
		}
	}
	if err := f.c.Create(ctx, secret); err != nil {
		return activity.Guest{}, fmt.Errorf("create Secret %s/%s: %w", ns, secret.Name, err)
	}
	if err := f.c.Create(ctx, instanceOf(vm, "node-"+strconv.Itoa(i%50), now.Add(-time.Hour))); err != nil {
		return activity.Guest{}, fmt.Errorf("create instance %s/%s: %w", ns, name, err)
	}
	return guest, nil
}

// emptyUsers empties the server's users Secrets, as a controller that never
// provisioned its users would have left them.
func (f *fleet) emptyUsers(ctx context.Context, b *testing.B) {
	b.Helper()
	for shard := range userset.Shards {
		s := &corev1.Secret{}
		key := types.NamespacedName{Namespace: fleetServer.Namespace, Name: userset.SecretName(fleetServer.Name, shard)}
		if err := f.c.Get(ctx, key, s); err != nil {
			b.Fatalf("the controller wrote no users Secret %s: %v", key, err)
		}
		s.Data[userset.Key] = userset.Encode(nil)
		if err := f.c.Update(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
}

// usersComplete is whether the server's users Secrets hold every VM's user
// with its hash.
func (f *fleet) usersComplete(ctx context.Context) (bool, error) {
	users := 0
	for shard := range userset.Shards {
		s := &corev1.Secret{}
		key := types.NamespacedName{Namespace: fleetServer.Namespace, Name: userset.SecretName(fleetServer.Name, shard)}
		if err := f.c.Get(ctx, key, s); err != nil {
			return false, err
		}
		held, err := userset.Decode(s.Data[userset.Key])
		if err != nil {
			return false, err
		}
		for u, h := range held {
			if h.String() != f.hash.String() {
				return false, fmt.Errorf("user %s has another hash", u)
			}
		}
		users += len(held)
	}
	if users != f.n {
		return false, fmt.Errorf("%d users of %d", users, f.n)
	}
	return true, nil
}

// perVM are the controllers that reconcile every VM (or its Secret) once
// when they start.
var perVM = []string{"credential-hasher", "vm-credentials", "vm-bootstrap", "guest-activity"}

// settle waits until the controller has reconciled every VM, its BSLS and
// written every user, with nothing queued or in flight, and returns how
// long that took from its start.
func (p *process) settle(b *testing.B, f *fleet) time.Duration {
	b.Helper()
	var (
		last error
		// seen is the last scrape, logged as the settling goes and
		// when it fails: where the time went.
		seen     map[string]*dto.MetricFamily
		progress = time.Now()
	)
	err := p.waitFor(settled, 250*time.Millisecond, func() (bool, error) {
		families, err := testbed.Scrape(p.metrics)
		if err != nil {
			return false, err
		}
		seen = families
		if time.Since(progress) > 15*time.Second {
			progress = time.Now()
			b.Logf("%s after %s: %s", p.Spec.Name, time.Since(p.started).Round(time.Second), requests(families))
		}
		for _, c := range perVM {
			if done := sum(families, "controller_runtime_reconcile_total", "controller", c); done < float64(f.n) {
				last = fmt.Errorf("%s reconciled %v of %d", c, done, f.n)
				return false, last
			}
		}
		if sum(families, "controller_runtime_reconcile_total", "controller", "backupstoragelocationserver") < 1 {
			return false, fmt.Errorf("the BSLS was not reconciled yet")
		}
		if q := sum(families, "workqueue_depth", "", ""); q > 0 {
			return false, fmt.Errorf("%v reconciles queued", q)
		}
		if w := sum(families, "controller_runtime_active_workers", "", ""); w > 0 {
			return false, fmt.Errorf("%v reconciles in flight", w)
		}
		return f.usersComplete(context.Background())
	})
	if err != nil {
		b.Fatalf("%s did not settle: %v (%v); %s", p.Spec.Name, err, last, requests(seen))
	}
	return time.Since(p.started)
}

// requests sums up a scrape of the controller: its requests to the API
// server by method and code, and what its reconcilers did.
func requests(families map[string]*dto.MetricFamily) string {
	byCall := map[string]float64{}
	for _, m := range families["rest_client_requests_total"].GetMetric() {
		var method, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "method":
				method = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		byCall[method+" "+code] += m.GetCounter().GetValue()
	}
	reconciled := map[string]float64{}
	for _, c := range append([]string{"backupstoragelocationserver"}, perVM...) {
		reconciled[c] = sum(families, "controller_runtime_reconcile_total", "controller", c)
	}
	return fmt.Sprintf("requests %v, reconciled %v, queued %v, heap %.0f MiB", byCall, reconciled,
		sum(families, "workqueue_depth", "", ""), sum(families, "go_memstats_heap_inuse_bytes", "", "")/(1<<20))
}

// heap is the Go heap in use, in MiB: what RSS holds beyond the binary,
// the runtime and freed memory the runtime has not given back yet.
func (p *process) heap(b *testing.B) float64 {
	b.Helper()
	families, err := testbed.Scrape(p.metrics)
	if err != nil {
		b.Fatal(err)
	}
	return sum(families, "go_memstats_heap_inuse_bytes", "", "") / (1 << 20)
}

// logReconcileTimes logs how long each controller spent reconciling, in
// all: where a settling's time went.
func (p *process) logReconcileTimes(b *testing.B) {
	b.Helper()
	families, err := testbed.Scrape(p.metrics)
	if err != nil {
		b.Fatal(err)
	}
	spent := map[string]float64{}
	for _, m := range families["controller_runtime_reconcile_time_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "controller" {
				spent[l.GetValue()] += m.GetHistogram().GetSampleSum()
			}
		}
	}
	b.Logf("%s: seconds reconciling, by controller: %v", p.Spec.Name, spent)
}

// hashes is how many passwords the controller hashed.
func (p *process) hashes(b *testing.B) float64 {
	b.Helper()
	families, err := testbed.Scrape(p.metrics)
	if err != nil {
		b.Fatal(err)
	}
	return sum(families, "guestbackup_password_hashes_total", "", "")
}

// writes is how many requests that write (create, update, patch,
// delete) the process sent the API server so far, from client-go's
// counter: its Events and leader election included.
func (p *process) writes(b *testing.B) float64 {
	b.Helper()
	families, err := testbed.Scrape(p.metrics)
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, method := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		total += sum(families, "rest_client_requests_total", "method", method)
	}
	return total
}

// sum adds the values of the series of a counter or gauge whose label has
// value (every series when label is "").
func sum(families map[string]*dto.MetricFamily, name, label, value string) float64 {
	var total float64
	for _, m := range families[name].GetMetric() {
		if label != "" && !hasLabel(m, label, value) {
			continue
		}
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// startWebhook starts cmd/webhook as the chart does, serving on loopback
// with a certificate of a fresh CA.
func (f *fleet) startWebhook(b *testing.B) *process {
	b.Helper()
	dir := b.TempDir()
	ca, err := testbed.WriteLoopbackServingCert(dir)
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	p := f.start(b, "webhook", "webhook", []string{"--cert-dir=" + dir}, func(p *process) []string {
		p.port = freePort(b)
		return []string{"--port=" + strconv.Itoa(p.port)}
	})
	p.roots = roots
	if err := p.waitFor(time.Minute, 100*time.Millisecond, func() (bool, error) {
		conn, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(p.port), &tls.Config{RootCAs: p.roots, MinVersion: tls.VersionTLS12})
		if err != nil {
			return false, err
		}
		return true, conn.Close()
	}); err != nil {
		b.Fatalf("the webhook does not serve: %v", err)
	}
	return p
}

// admissions re-admits the fleet's first VM (an update that changes
// nothing: the steady state) count times over HTTPS, after one admission
// that fills the webhook's caches, and returns the latency's p50 and p99.
func (p *process) admissions(b *testing.B, f *fleet, count int) (p50, p99 time.Duration) {
	b.Helper()
	var vm metav1.PartialObjectMetadata
	if err := json.Unmarshal(f.sample, &vm); err != nil {
		b.Fatal(err)
	}
	review, err := testbed.VMUpdateReview(vm.Namespace, vm.Name, f.sample, f.sample)
	if err != nil {
		b.Fatal(err)
	}
	httpc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.roots, MinVersion: tls.VersionTLS12}}}
	url := "https://127.0.0.1:" + strconv.Itoa(p.port) + mutate.Path
	admit := func() error { return testbed.AdmitUnchanged(httpc, url, review) }
	if err := admit(); err != nil {
		b.Fatalf("the first admission: %v", err)
	}
	var times []time.Duration
	for range count {
		start := time.Now()
		if err := admit(); err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	return testbed.Percentile(times, 50), testbed.Percentile(times, 99)
}
