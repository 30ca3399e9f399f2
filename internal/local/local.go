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
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
)

// Namespace is where guestbackup itself runs: the webhook never mutates
// objects in it.
const Namespace = "guestbackup-system"

// Timeouts of the steps a cluster would take on its own.
const (
	// startTimeout bounds the start of the manager's webhook server.
	startTimeout = 30 * time.Second
	// deploymentTimeout bounds the wait for the controller to write a
	// BSLS's Deployment.
	deploymentTimeout = 30 * time.Second
	// serverReadyTimeout bounds a BSLS server pod's start (its init
	// container creates or opens the repository).
	serverReadyTimeout = 2 * time.Minute
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
}

// Platform is guestbackup running on the test bed.
type Platform struct {
	// API is the API server, with a client as its admin.
	API *testbed.APIServer
	// KubeVirt is KubeVirt's control plane, virt-api and virt-controller.
	KubeVirt *testbed.KubeVirt
	// MetricsAddr is the loopback address of the manager's /metrics.
	MetricsAddr string

	// disks holds each VM's root disk, by the VM's UID.
	disks string
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
	return &Platform{API: api, MetricsAddr: metricsAddr, disks: tb.TempDir(), claims: map[types.NamespacedName]string{}, stock: o.StockGuests}, nil
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
// https://10.0.2.2:<port>), its repository claim in a folder of tb's, and
// its client port on the next one, and waits until it is ready; it then records on the Deployment what the
// deployment controller would. tb's cleanup stops the pod.
func (p *Platform) ServeBSLS(ctx context.Context, tb testbed.TB, bsls *v1alpha1.BackupStorageLocationServer, port int) (*testbed.Pod, error) {
	tb.Helper()
	d := &appsv1.Deployment{}
	key := types.NamespacedName{Namespace: bsls.Namespace, Name: kopiaserver.DeploymentName(bsls)}
	err := testbed.WaitFor(deploymentTimeout, 100*time.Millisecond, func() (bool, error) {
		return p.API.Client.Get(ctx, key, d) == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the controller wrote no Deployment %s: %w", key, err)
	}
	tools, err := testbed.LoadTools()
	if err != nil {
		return nil, err
	}
	claim := tb.TempDir()
	p.claims[client.ObjectKeyFromObject(bsls)] = claim
	pod := testbed.RunPod(tb, testbed.PodOptions{
		Namespace: bsls.Namespace, Spec: d.Spec.Template.Spec, API: p.API,
		Binaries: map[string]string{
			kopiaserver.KopiaBinary:       tools.Kopia,
			kopiaserver.ClientBinaryARM64: tools.KopiaARM64,
			kopiaserver.ServerBinary:      testbed.Build(tb, "./cmd/server"),
		},
		Claims: map[string]string{kopiaserver.ClaimName(bsls): claim},
		// The client port is the next one, as clientdist.URL says.
		Ports: map[int32]int{v1alpha1.DefaultServerPort: port, clientdist.DefaultPort: port + 1},
	})
	if err := pod.WaitReady(serverReadyTimeout); err != nil {
		return nil, fmt.Errorf("server pod of %s: %w", key, err)
	}
	err = testbed.WaitFor(deploymentTimeout, 100*time.Millisecond, func() (bool, error) {
		cur := &appsv1.Deployment{}
		if err := p.API.Client.Get(ctx, key, cur); err != nil {
			return false, nil
		}
		cur.Status = appsv1.DeploymentStatus{ObservedGeneration: cur.Generation, Replicas: 1, ReadyReplicas: 1, AvailableReplicas: 1, UpdatedReplicas: 1}
		return p.API.Client.Status().Update(ctx, cur) == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("record Deployment %s as available: %w", key, err)
	}
	// The pod publishes the kopia client it serves; once the controller
	// has it in the status, every VM admitted from now on carries it, as
	// on a cluster whose server runs for longer than a spec.
	err = testbed.WaitFor(deploymentTimeout, 100*time.Millisecond, func() (bool, error) {
		cur := &v1alpha1.BackupStorageLocationServer{}
		return p.API.Client.Get(ctx, client.ObjectKeyFromObject(bsls), cur) == nil && cur.Status.Client != nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("BackupStorageLocationServer %s publishes no kopia client: %w", client.ObjectKeyFromObject(bsls), err)
	}
	return pod, nil
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
// for specs that boot a guest without an instance.
func (p *Platform) Realise(ctx context.Context, vm *kubevirtv1.VirtualMachine) (testbed.GuestOptions, error) {
	if vm.Spec.Template == nil {
		return testbed.GuestOptions{}, fmt.Errorf("VirtualMachine %s/%s has no template", vm.Namespace, vm.Name)
	}
	if vm.UID == "" {
		return testbed.GuestOptions{}, fmt.Errorf("VirtualMachine %s/%s has no UID: realise the VM the API server stored", vm.Namespace, vm.Name)
	}
	return p.realise(ctx, vm.Namespace, vm.Name, vm.UID, &vm.Spec.Template.Spec)
}

// RealiseInstance returns the boot of vmi's guest the way KubeVirt's
// virt-launcher would make it: its cloudInitNoCloud volume (inline userData,
// or the userdata key of its secretRef, untouched) is the NoCloud seed with
// KubeVirt's instance-id (the firmware UUID, see InstanceID), each secret
// volume a disk with its label and its disk's serial. The containerDisk is
// the test bed's guest image, whatever image it names, under an overlay of
// the VM's own (by the UID of the VM that controls vmi) that every boot of
// the VM reuses, as a persistent volume would be.
func (p *Platform) RealiseInstance(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (testbed.GuestOptions, error) {
	owner := metav1.GetControllerOf(vmi)
	if owner == nil || owner.Kind != "VirtualMachine" {
		return testbed.GuestOptions{}, fmt.Errorf("VirtualMachineInstance %s/%s is controlled by no VirtualMachine", vmi.Namespace, vmi.Name)
	}
	return p.realise(ctx, vmi.Namespace, vmi.Name, owner.UID, &vmi.Spec)
}

// realise builds the boot of the guest of VM namespace/name (whose UID is
// vmUID) from spec, its template's or its instance's.
func (p *Platform) realise(ctx context.Context, namespace, name string, vmUID types.UID, spec *kubevirtv1.VirtualMachineInstanceSpec) (testbed.GuestOptions, error) {
	opts := testbed.GuestOptions{
		InstanceID: instanceID(name, spec),
		RootDisk:   filepath.Join(p.disks, string(vmUID)+".qcow2"),
	}
	secretData := func(secret string) (map[string][]byte, error) {
		s := &corev1.Secret{}
		if err := p.API.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: secret}, s); err != nil {
			return nil, fmt.Errorf("VirtualMachine %s/%s: %w", namespace, name, err)
		}
		return s.Data, nil
	}
	for _, v := range spec.Volumes {
		switch {
		case v.CloudInitNoCloud != nil:
			if opts.UserData != nil {
				return opts, errors.New("more than one cloudInitNoCloud volume")
			}
			src := v.CloudInitNoCloud
			opts.UserData = []byte(src.UserData)
			if src.UserDataSecretRef != nil {
				data, err := secretData(src.UserDataSecretRef.Name)
				if err != nil {
					return opts, err
				}
				// KubeVirt reads either spelling of the key.
				opts.UserData = data["userdata"]
				if opts.UserData == nil {
					opts.UserData = data["userData"]
				}
			}
		case v.Secret != nil:
			data, err := secretData(v.Secret.SecretName)
			if err != nil {
				return opts, err
			}
			serial := ""
			for _, d := range spec.Domain.Devices.Disks {
				if d.Name == v.Name {
					serial = d.Serial
				}
			}
			opts.ExtraDisks = append(opts.ExtraDisks, testbed.GuestDisk{Files: data, Label: v.Secret.VolumeLabel, Serial: serial})
		}
	}
	if opts.UserData == nil {
		return opts, fmt.Errorf("VirtualMachine %s/%s has no cloud-init user-data", namespace, name)
	}
	return opts, nil
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
	// when the guest started.
	VMI *kubevirtv1.VirtualMachineInstance

	api *testbed.APIServer
	vm  types.NamespacedName
}

// StartVM starts vm the KubeVirt way and boots its guest: it sets the VM's
// runStrategy to Always (what `virtctl start` asks for), waits for the
// VirtualMachineInstance virt-controller creates from the VM, then plays the
// node: it realises the guest from that instance (RealiseInstance), so that
// it reads the Secrets as they are then, and boots it. tb's cleanup stops
// the guest and the VM.
func (p *Platform) StartVM(ctx context.Context, tb testbed.TB, vm *kubevirtv1.VirtualMachine) (*Instance, error) {
	tb.Helper()
	key := client.ObjectKeyFromObject(vm)
	if err := setRunStrategy(ctx, p.API.Client, key, kubevirtv1.RunStrategyAlways); err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = setRunStrategy(context.Background(), p.API.Client, key, kubevirtv1.RunStrategyHalted) })
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
	opts, err := p.RealiseInstance(ctx, vmi)
	if err != nil {
		return nil, err
	}
	opts.Stock = p.stock
	return &Instance{Guest: testbed.StartGuest(tb, opts), VMI: vmi, api: p.API, vm: key}, nil
}

// Wait waits for the guest to power itself off, then stops its VM the
// KubeVirt way (runStrategy Halted, what `virtctl stop` asks for) and waits
// until virt-controller has deleted the instance.
func (i *Instance) Wait(ctx context.Context) (testbed.GuestResult, error) {
	res, err := i.Guest.Wait()
	if serr := i.stop(ctx); serr != nil && err == nil {
		err = serr
	}
	return res, err
}

func (i *Instance) stop(ctx context.Context) error {
	if err := setRunStrategy(ctx, i.api.Client, i.vm, kubevirtv1.RunStrategyHalted); err != nil {
		return err
	}
	err := testbed.WaitFor(instanceTimeout, 50*time.Millisecond, func() (bool, error) {
		cur := &kubevirtv1.VirtualMachineInstance{}
		err := i.api.Client.Get(ctx, i.vm, cur)
		return apierrors.IsNotFound(err) || (err == nil && cur.UID != i.VMI.UID), client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("virt-controller did not delete the VirtualMachineInstance of stopped VM %s: %w", i.vm, err)
	}
	return nil
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
	list := &corev1.EventList{}
	if err := p.API.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
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
