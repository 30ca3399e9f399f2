// Package local runs the whole of guestbackup on the test bed, in one
// process, the way a cluster would: a real API server with guestbackup's
// MutatingWebhookConfiguration (as the chart installs it), the webhook and
// the controller each in a manager wired and cached as its binary
// (internal/webhook, internal/controller), a BSLS's Kopia server
// run from the Deployment the controller wrote, KubeVirt's own control plane
// (virt-api's admission webhooks in the same chain as guestbackup's,
// virt-controller making VirtualMachineInstances), and a
// VirtualMachineInstance realised as a qemu guest the way KubeVirt's node
// (virt-handler, virt-launcher) would.
//
// It is the local backend of the end-to-end suite (test/kubevirt) and the
// engine of `make demo`.
package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/internal/webhook"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/requests"
)

// Namespace is where guestbackup itself runs: the webhook never mutates
// objects in it.
const Namespace = "guestbackup-system"

// Timeouts of the steps a cluster would take on its own.
const (
	// startTimeout bounds the start of the manager's webhook server.
	startTimeout = 30 * time.Second
	// serverReadyTimeout bounds a BSLS server pod's start (its init
	// container creates or opens the repository).
	serverReadyTimeout = 2 * time.Minute
	// clientPublishTimeout bounds a ready server pod's publication of the
	// kopia client it serves, and the controller's copy of it into status.
	clientPublishTimeout = time.Minute
	// instanceTimeout bounds virt-controller's creation of a started VM's
	// instance, and its deletion of a stopped VM's (well under a second
	// on an idle machine).
	instanceTimeout = time.Minute
)

// Options adjust Start.
type Options struct {
	// Logger receives the managers' logs; default: discarded.
	Logger logr.Logger
	// Controller configures the controller; default ControllerOptions().
	Controller *controller.Options
	// Setup, when set, replaces what runs: a single manager, configured as
	// cmd/webhook's (its cache and webhook server), runs Setup, and no
	// controller runs. It is for specs of the webhook alone that wire its
	// handler themselves.
	Setup func(ctrl.Manager) error
	// StockGuests boots every guest it realises from the stock-like image
	// (no kopia: the guest fetches it from its server).
	StockGuests bool
	// Requests runs guestbackup as the chart's requests.enabled does:
	// pkg/requests' webhook registered, and the controller carrying
	// requests out.
	Requests bool
}

// Platform is guestbackup running on the test bed.
type Platform struct {
	// API is the API server, with a client as its admin.
	API *testbed.APIServer
	// KubeVirt is KubeVirt's control plane, virt-api and virt-controller.
	KubeVirt *testbed.KubeVirt
	// MetricsAddr is the loopback address of the manager's /metrics.
	MetricsAddr string

	// disks holds each VM's root disk, by the VM's UID, and each launcher's
	// volumes and disks.
	disks string
	// tb is the test the platform lives for; kubevirtSeed is
	// kubevirt-seed's binary, once built.
	tb           testbed.TB
	kubevirtSeed string
	// claims are the folders ServeBSLS gave the BSLSs' repository claims.
	claims map[types.NamespacedName]string
	// stock: guests boot the stock-like image.
	stock bool
}

// ControllerOptions are cmd/controller's settings on the test bed: the
// image name the pod runner recognises, the Namespace, and intervals short
// enough for a test.
func ControllerOptions() controller.Options {
	return controller.Options{Image: "guestbackup:local", Namespace: Namespace, ActivityInterval: 2 * time.Second, Hashers: 2}
}

// Start starts a real API server with guestbackup's webhook configuration
// (mutate.Webhook, pointed at a loopback server), KubeVirt's control plane
// (testbed.StartKubeVirt: every VirtualMachine is admitted by KubeVirt's own
// webhooks too) and, in this process, the two binaries as they run in a
// cluster: a manager wired as cmd/webhook's, serving the webhook, and one
// wired as cmd/controller's, each with its binary's cache (see Options.Setup for a webhook alone). It creates the
// Namespace guestbackup runs in. tb's cleanup stops them all.
func Start(tb testbed.TB, o Options) *Platform {
	tb.Helper()
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "guestbackup"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{mutate.Webhook(Namespace, admissionregistrationv1.WebhookClientConfig{
			Service: &admissionregistrationv1.ServiceReference{Name: "guestbackup-webhook", Namespace: Namespace, Path: ptr.To(mutate.Path)},
		})},
	}
	if o.Requests {
		cfg.Webhooks = append(cfg.Webhooks, requests.Webhook(admissionregistrationv1.WebhookClientConfig{
			Service: &admissionregistrationv1.ServiceReference{Name: "guestbackup-webhook", Namespace: Namespace, Path: ptr.To(requests.Path)},
		}))
	}
	api := testbed.StartAPIServer(tb, testbed.APIServerOptions{Webhooks: envtest.WebhookInstallOptions{
		MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{cfg},
	}})
	kv := testbed.StartKubeVirt(tb, api)
	p, err := startManagers(tb, api, o)
	if err != nil {
		tb.Fatalf("start guestbackup: %v", err)
	}
	p.KubeVirt = kv
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if err := api.Client.Create(context.Background(), ns); err != nil {
		tb.Fatalf("create namespace %s: %v", Namespace, err)
	}
	if err := registerNode(context.Background(), api.Client); err != nil {
		tb.Fatalf("%v", err)
	}
	// What the chart installs for the controller to bind to the server
	// pods of BSLSs with several replicas.
	if err := api.CreateServerMaintenanceRole(); err != nil {
		tb.Fatalf("%v", err)
	}
	return p
}

// startManagers starts the webhook's manager, then, unless o.Setup
// replaces both, the controller's. The webhook's serves /metrics on
// MetricsAddr: controller-runtime's metrics registry is global, so that
// endpoint serves the controller's metrics too.
func startManagers(tb testbed.TB, api *testbed.APIServer, o Options) (*Platform, error) {
	wh := api.Env.WebhookInstallOptions
	server := ctrlwebhook.NewServer(ctrlwebhook.Options{Host: wh.LocalServingHost, Port: wh.LocalServingPort, CertDir: wh.LocalServingCertDir})
	port, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	metricsAddr := "127.0.0.1:" + strconv.Itoa(port)
	setup := o.Setup
	if setup == nil {
		setup = webhook.Setup
	}
	err = runManager(tb, api, testbed.ManagerOptions{
		Logger: o.Logger.WithName("webhook"), MetricsAddr: metricsAddr, WebhookServer: server, Cache: webhook.Cache(),
	}, setup)
	if err != nil {
		return nil, err
	}
	if o.Setup == nil {
		co := ControllerOptions()
		if o.Controller != nil {
			co = *o.Controller
		}
		co.Requests = co.Requests || o.Requests
		err = runManager(tb, api, testbed.ManagerOptions{Logger: o.Logger.WithName("controller"), Cache: controller.Cache()},
			func(mgr ctrl.Manager) error { return controller.Setup(mgr, co) })
		if err != nil {
			return nil, err
		}
	}
	err = testbed.WaitFor(startTimeout, 50*time.Millisecond, func() (bool, error) {
		return server.StartedChecker()(nil) == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("webhook server: %w", err)
	}
	return &Platform{API: api, MetricsAddr: metricsAddr, disks: tb.TempDir(), tb: tb, claims: map[types.NamespacedName]string{}, stock: o.StockGuests}, nil
}

// runManager runs a manager until tb's cleanup.
func runManager(tb testbed.TB, api *testbed.APIServer, o testbed.ManagerOptions, setup func(ctrl.Manager) error) error {
	stop, err := testbed.RunManager(api, o, setup)
	if err != nil {
		return err
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Logf("manager: %v", err)
		}
	})
	return nil
}

// ServeBSLS runs the Kopia server of bsls from the Deployment the
// controller writes for it, as the kubelet would, with its server port on
// the host's loopback port (a node port, in effect: a guest reaches it as
// https://10.0.2.2:<port>), its repository claim in a folder of tb's (or
// the one UseClaim gave), its client port on the next one (pick both with
// testbed.FreePorts(2)), and waits until it is ready; it then records on the Deployment what the
// deployment controller would. tb's cleanup stops the pod.
func (p *Platform) ServeBSLS(ctx context.Context, tb testbed.TB, bsls *v1alpha1.BackupStorageLocationServer, port int) (*testbed.Pod, error) {
	tb.Helper()
	key := types.NamespacedName{Namespace: bsls.Namespace, Name: kopiaserver.DeploymentName(bsls)}
	tools, err := testbed.LoadTools()
	if err != nil {
		return nil, err
	}
	claim, ok := p.claims[client.ObjectKeyFromObject(bsls)]
	if !ok {
		claim = tb.TempDir()
		p.claims[client.ObjectKeyFromObject(bsls)] = claim
	}
	pod, err := testbed.RunDeployment(ctx, tb, p.API, key, testbed.PodOptions{
		Binaries: ServerBinaries(tb, tools),
		Claims:   map[string]string{kopiaserver.ClaimName(bsls): claim},
		// The client port is the next one, as clientdist.URL says.
		Ports: map[int32]int{v1alpha1.DefaultServerPort: port, clientdist.DefaultPort: port + 1},
	}, serverReadyTimeout)
	if err != nil {
		return nil, fmt.Errorf("the server of BSLS %s/%s: %w", bsls.Namespace, bsls.Name, err)
	}
	// The pod publishes the kopia client it serves; once the controller
	// has it in the status, every VM admitted from now on carries it, as
	// on a cluster whose server runs for longer than a spec.
	err = testbed.WaitFor(clientPublishTimeout, 100*time.Millisecond, func() (bool, error) {
		cur := &v1alpha1.BackupStorageLocationServer{}
		return p.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), cur) == nil && cur.Status.Client != nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("BackupStorageLocationServer %s publishes no kopia client: %w", client.ObjectKeyFromObject(bsls), err)
	}
	return pod, nil
}

// ServerBinaries are the local binaries that stand for the server image's
// commands (kopia and guestbackup-server), for testbed.RunPod.
func ServerBinaries(tb testbed.TB, tools testbed.Tools) map[string]string {
	tb.Helper()
	return map[string]string{
		kopiaserver.KopiaBinary:       tools.Kopia,
		kopiaserver.ClientBinaryARM64: tools.KopiaARM64,
		kopiaserver.ServerBinary:      testbed.Build(tb, "./cmd/server"),
	}
}

// Claim returns the folder ServeBSLS gave the repository claim of bsls, ""
// when it served none.
func (p *Platform) Claim(bsls *v1alpha1.BackupStorageLocationServer) string {
	return p.claims[client.ObjectKeyFromObject(bsls)]
}

// UseClaim makes ServeBSLS serve bsls from the claim folder dir, e.g.
// another platform's (Claim): the same storage attached to a new cluster.
func (p *Platform) UseClaim(bsls *v1alpha1.BackupStorageLocationServer, dir string) {
	p.claims[client.ObjectKeyFromObject(bsls)] = dir
}

// firmwareUUIDNamespace is the UUIDv5 namespace of KubeVirt's legacy
// firmware UUID (kubevirt.io/kubevirt pkg/virt-controller/watch/vm,
// firmware.go: magicUUID and CalculateLegacyUUID).
var firmwareUUIDNamespace = uuid.MustParse("6a1a24a1-4061-4607-8bf4-a3963d0c5895")

// InstanceID is the NoCloud instance-id KubeVirt gives vm's guest: its
// firmware UUID (pkg/cloud-init, cloudInitUUIDFromVMI, when the VM gives no
// meta-data of its own). virt-api's mutating webhook sets
// spec.template.spec.domain.firmware.uuid once, at the VM's creation, and
// virt-controller copies it into every instance; where it is absent,
// virt-controller's firmware sync sets the legacy UUID, a UUIDv5 of the VM's
// name (CalculateLegacyUUID). Either way it stays the same across every stop
// and start of the VM, so cloud-init runs its per-instance modules at the
// VM's first boot only.
func InstanceID(vm *kubevirtv1.VirtualMachine) string {
	if t := vm.Spec.Template; t != nil {
		return instanceID(vm.Name, &t.Spec)
	}
	return instanceID(vm.Name, &kubevirtv1.VirtualMachineInstanceSpec{})
}

func instanceID(name string, spec *kubevirtv1.VirtualMachineInstanceSpec) string {
	if f := spec.Domain.Firmware; f != nil && f.UUID != "" {
		return string(f.UUID)
	}
	return uuid.NewSHA1(firmwareUUIDNamespace, []byte(name)).String()
}

// Realise returns the boot of vm's guest as KubeVirt's node would make it
// from the instance of vm (see RealiseInstance), from the VM's template:
// for specs that boot a guest without an instance. The instance is the one
// virt-controller would make: the VM's name, namespace and template.
func (p *Platform) Realise(ctx context.Context, vm *kubevirtv1.VirtualMachine) (testbed.GuestOptions, error) {
	if vm.Spec.Template == nil {
		return testbed.GuestOptions{}, fmt.Errorf("VirtualMachine %s/%s has no template", vm.Namespace, vm.Name)
	}
	if vm.UID == "" {
		return testbed.GuestOptions{}, fmt.Errorf("VirtualMachine %s/%s has no UID: realise the VM the API server stored", vm.Namespace, vm.Name)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: vm.Name, Namespace: vm.Namespace},
		Spec:       *vm.Spec.Template.Spec.DeepCopy(),
	}
	// virt-controller gives every instance a firmware UUID (see
	// InstanceID); KubeVirt's seed would otherwise take a random one.
	if f := vmi.Spec.Domain.Firmware; f == nil || f.UUID == "" {
		if f == nil {
			vmi.Spec.Domain.Firmware = &kubevirtv1.Firmware{}
		}
		vmi.Spec.Domain.Firmware.UUID = types.UID(InstanceID(vm))
	}
	return p.realise(ctx, vmi, vm.UID)
}

// RealiseInstance returns the boot of vmi's guest the way KubeVirt's node
// makes it: the kubelet mounts the pod's Secret volumes (mountSecrets), and
// KubeVirt's own pkg/cloud-init and pkg/config, run by the test bed's
// kubevirt-seed (hack/tools/kubevirt) as virt-launcher runs them, build the
// cloud-init seed (instance-id: the firmware UUID, see InstanceID) and each
// secret volume's disk (its label), given its disk's serial. The
// containerDisk is the test bed's guest image, whatever image it names,
// under an overlay of the VM's own (by the UID of the VM that controls
// vmi) that every boot of the VM reuses, as a persistent volume would be.
func (p *Platform) RealiseInstance(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (testbed.GuestOptions, error) {
	owner := metav1.GetControllerOf(vmi)
	if owner == nil || owner.Kind != "VirtualMachine" {
		return testbed.GuestOptions{}, fmt.Errorf("VirtualMachineInstance %s/%s is controlled by no VirtualMachine", vmi.Namespace, vmi.Name)
	}
	return p.realise(ctx, vmi, owner.UID)
}

// realise builds the boot of vmi's guest, whose VM's UID is vmUID.
func (p *Platform) realise(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, vmUID types.UID) (testbed.GuestOptions, error) {
	opts := testbed.GuestOptions{
		InstanceID: instanceID(vmi.Name, &vmi.Spec),
		RootDisk:   filepath.Join(p.disks, string(vmUID)+".qcow2"),
	}
	dir, err := os.MkdirTemp(p.disks, "launcher-")
	if err != nil {
		return opts, err
	}
	secrets := filepath.Join(dir, "secret")
	if err := mountSecrets(ctx, p.API.Client, vmi, secrets); err != nil {
		return opts, err
	}
	seed, err := kubevirtSeed(ctx, p.seedTool(), vmi, secrets, filepath.Join(dir, "disks"))
	if err != nil {
		return opts, fmt.Errorf("VirtualMachineInstance %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	if seed.Seed == "" {
		return opts, fmt.Errorf("VirtualMachineInstance %s/%s has no cloud-init volume", vmi.Namespace, vmi.Name)
	}
	opts.Seed = seed.Seed
	// KubeVirt attaches the secret disks in the order of the instance's
	// disks.
	for _, d := range vmi.Spec.Domain.Devices.Disks {
		if iso, ok := seed.Disks[d.Name]; ok {
			opts.ExtraDisks = append(opts.ExtraDisks, testbed.GuestDisk{ISO: iso, Serial: d.Serial})
		}
	}
	return opts, nil
}

// seedTool is kubevirt-seed, built once per platform into a folder that
// lives as long as the platform (a spec's own would go with the spec).
func (p *Platform) seedTool() string {
	if p.kubevirtSeed == "" {
		p.kubevirtSeed = testbed.BuildKubeVirtTool(p.tb, "./kubevirt-seed", p.disks)
	}
	return p.kubevirtSeed
}

// Repository connects a kopia client to the filesystem repository of bsls,
// which ServeBSLS served, as its owner (with the repository password): what
// a storage admin sees, every user's snapshots whether or not the server
// still has the user.
func (p *Platform) Repository(ctx context.Context, tb testbed.TB, bsls *v1alpha1.BackupStorageLocationServer) (*testbed.KopiaClient, error) {
	claim, ok := p.claims[client.ObjectKeyFromObject(bsls)]
	if !ok {
		return nil, fmt.Errorf("BackupStorageLocationServer %s/%s was not served by ServeBSLS", bsls.Namespace, bsls.Name)
	}
	ref := kopiaserver.RepositoryPassword(bsls)
	s := &corev1.Secret{}
	if err := p.API.Client.Get(ctx, types.NamespacedName{Namespace: bsls.Namespace, Name: ref.Name}, s); err != nil {
		return nil, fmt.Errorf("repository password: %w", err)
	}
	c := testbed.NewKopiaClient(tb)
	if out, err := c.RunWithPassword(ctx, string(s.Data[ref.Key]), "repository", "connect", "filesystem",
		"--path="+filepath.Join(claim, bsls.Spec.Repository.PathPrefix)); err != nil {
		return nil, fmt.Errorf("connect to the repository of %s/%s: %w: %s", bsls.Namespace, bsls.Name, err, out)
	}
	return c, nil
}

// Instance is a running guest of a VM, with the VirtualMachineInstance
// that stands for it in the API.
type Instance struct {
	// Guest is the qemu guest.
	Guest *testbed.Guest
	// VMI is the VirtualMachineInstance virt-controller created, as it was
	// when the guest started (Running).
	VMI *kubevirtv1.VirtualMachineInstance
	// Pod is its virt-launcher pod, as it was when the guest started.
	Pod *corev1.Pod

	api     *testbed.APIServer
	vm      types.NamespacedName
	node    *node
	stopped bool
}

// StartOption adjusts StartVM.
type StartOption func(*startOptions)

type startOptions struct {
	whilePending func(*kubevirtv1.VirtualMachineInstance, *corev1.Pod)
}

// WhileLauncherPending runs f while the instance's virt-launcher pod is
// bound to the node but Pending, before the kubelet reads its volumes (the
// VM's Secrets among them): what a cluster shows while a node pulls an
// image. f gets the instance and the pod as they are then.
func WhileLauncherPending(f func(*kubevirtv1.VirtualMachineInstance, *corev1.Pod)) StartOption {
	return func(o *startOptions) { o.whilePending = f }
}

// StartVM starts vm the KubeVirt way and boots its guest: it sets the VM's
// runStrategy to Always (what `virtctl start` asks for), waits for the
// VirtualMachineInstance and virt-launcher pod virt-controller creates, then
// plays the node (see node): it binds the pod, reports it Pending, reads
// the VM's Secrets as the kubelet mounts the pod's volumes (realising the
// guest from the instance, RealiseInstance), reports the pod Running,
// waits for virt-controller to move the instance to Scheduled, boots the
// guest and reports the instance Running. tb's cleanup stops the guest and
// the VM.
func (p *Platform) StartVM(ctx context.Context, tb testbed.TB, vm *kubevirtv1.VirtualMachine, options ...StartOption) (*Instance, error) {
	tb.Helper()
	var o startOptions
	for _, opt := range options {
		opt(&o)
	}
	key := client.ObjectKeyFromObject(vm)
	if err := setRunStrategy(ctx, p.API.Client, key, kubevirtv1.RunStrategyAlways); err != nil {
		return nil, err
	}
	i := &Instance{api: p.API, vm: key}
	tb.Cleanup(func() {
		if err := i.stop(context.Background()); err != nil {
			tb.Logf("stop VM %s: %v", key, err)
		}
	})
	vmi := &kubevirtv1.VirtualMachineInstance{}
	err := testbed.WaitFor(instanceTimeout, 50*time.Millisecond, func() (bool, error) {
		if err := p.API.Client.Get(ctx, key, vmi); err != nil {
			return false, err
		}
		owner := metav1.GetControllerOf(vmi)
		return owner != nil && owner.UID == vm.UID && vmi.DeletionTimestamp == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("virt-controller made no VirtualMachineInstance of %s: %w", key, err)
	}
	pod, err := launcherPod(ctx, p.API.Client, vmi)
	if err != nil {
		return nil, err
	}
	i.node = &node{c: p.API.Client, handler: p.KubeVirt.Handler, vmi: vmi, pod: pod}
	if err := i.node.schedule(ctx); err != nil {
		return nil, err
	}
	if o.whilePending != nil {
		o.whilePending(vmi.DeepCopy(), i.node.pod.DeepCopy())
	}
	opts, err := p.RealiseInstance(ctx, vmi)
	if err != nil {
		return nil, err
	}
	opts.Stock = p.stock
	if err := i.node.run(ctx); err != nil {
		return nil, err
	}
	if err := i.node.scheduled(ctx); err != nil {
		return nil, err
	}
	i.Guest = testbed.StartGuest(tb, opts)
	i.node.guest = i.Guest
	if err := i.node.running(ctx); err != nil {
		return nil, err
	}
	i.VMI, i.Pod = i.node.vmi.DeepCopy(), i.node.pod.DeepCopy()
	return i, nil
}

// Wait waits for the guest to power itself off, then stops its VM the
// KubeVirt way (runStrategy Halted, what `virtctl stop` asks for) and plays
// the node's part until virt-controller has deleted the instance.
func (i *Instance) Wait(ctx context.Context) (testbed.GuestResult, error) {
	res, err := i.Guest.Wait()
	if serr := i.stop(ctx); serr != nil && err == nil {
		err = serr
	}
	return res, err
}

// Stop stops the VM the KubeVirt way while its guest runs (runStrategy
// Halted, what `virtctl stop` asks for): the guest is stopped once
// virt-controller deleted the instance, as virt-launcher would, and the
// node's part is played until the instance is gone.
func (i *Instance) Stop(ctx context.Context) error {
	return i.stop(ctx)
}

// stop stops the VM, once.
func (i *Instance) stop(ctx context.Context) error {
	if i.stopped {
		return nil
	}
	i.stopped = true
	if err := setRunStrategy(ctx, i.api.Client, i.vm, kubevirtv1.RunStrategyHalted); err != nil {
		return err
	}
	if i.node == nil {
		return nil
	}
	return i.node.stopped(ctx)
}

// setRunStrategy sets the runStrategy of VM key.
func setRunStrategy(ctx context.Context, c client.Client, key types.NamespacedName, rs kubevirtv1.VirtualMachineRunStrategy) error {
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"runStrategy":"`+string(rs)+`"}}`))
	if err := c.Patch(ctx, vm, patch); err != nil {
		return fmt.Errorf("set the runStrategy of VirtualMachine %s to %s: %w", key, rs, err)
	}
	return nil
}

// Events returns the Events about the object kind/name in namespace, oldest
// first, as "Type Reason: message".
func (p *Platform) Events(ctx context.Context, namespace, kind, name string) ([]string, error) {
	return EventsOf(ctx, p.API.Client, namespace, kind, name)
}

// EventsOf returns the Events c reads about the object kind/name in
// namespace, oldest first, as "Type Reason: message", on any cluster.
func EventsOf(ctx context.Context, c client.Client, namespace, kind, name string) ([]string, error) {
	list := &corev1.EventList{}
	if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list Events in %s: %w", namespace, err)
	}
	// Events are named after their object and a timestamp, but the time
	// is what orders a story.
	slices.SortStableFunc(list.Items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name {
			out = append(out, e.Type+" "+e.Reason+": "+e.Message)
		}
	}
	return out, nil
}

// eventTime is when e first happened, whichever API wrote it.
func eventTime(e corev1.Event) time.Time {
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}
