package kubevirt

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/internal/webhook"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/test/story"
)

var _ = Describe("KubeVirt's own control plane, in the same chain as guestbackup's webhook", Ordered, func() {
	const ns = "team-k"
	var (
		ctx      context.Context
		platform *local.Platform
		api      *testbed.APIServer
	)
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	getVM := func(name string) *kubevirtv1.VirtualMachine {
		GinkgoHelper()
		vm := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, key(name), vm)).To(Succeed())
		return vm
	}
	// optedIn is a VM whose owner asked for backups and wrote no
	// cloud-init: guestbackup's webhook adds the cloud-init volume and disk.
	optedIn := func(name string) *kubevirtv1.VirtualMachine {
		return optIn(story.TypicalVM(name), ns, "backup/main")
	}
	runStrategy := func(name string, rs kubevirtv1.VirtualMachineRunStrategy) {
		GinkgoHelper()
		vm := getVM(name)
		patch := client.MergeFrom(vm.DeepCopy())
		vm.Spec.RunStrategy = &rs
		Expect(api.Client.Patch(ctx, vm, patch)).To(Succeed())
	}
	// instance is the VMI virt-controller made of VM name, once it exists.
	instance := func(name string) *kubevirtv1.VirtualMachineInstance {
		GinkgoHelper()
		vmi := &kubevirtv1.VirtualMachineInstance{}
		Eventually(func() error { return api.Client.Get(ctx, key(name), vmi) }).WithTimeout(time.Minute).Should(Succeed(),
			"virt-controller creates the VMI of a VM whose runStrategy is Always")
		return vmi
	}

	BeforeAll(func() {
		ctx = context.Background()
		// guestbackup's webhook alone: no controller rewrites the BSLS's
		// Ready status.
		platform = local.Start(GinkgoT(), local.Options{Logger: GinkgoLogr, Setup: webhook.Setup})
		api = platform.API
		AddReportEntry("KubeVirt's control plane started in", platform.KubeVirt.Startup.Round(10*time.Millisecond).String())
		readyBSLS(ctx, api, "backup", ns)
	})

	AfterAll(func() {
		for name, p := range map[string]*testbed.Process{"virt-api": platform.KubeVirt.API, "virt-controller": platform.KubeVirt.Controller} {
			if rss, err := p.RSS(); err == nil {
				AddReportEntry(name+" resident memory", fmt.Sprintf("%d MiB", rss>>20))
			}
		}
	})

	It("stores a VM guestbackup injected as KubeVirt's validation accepted and its mutator defaulted it", func() {
		Expect(api.Client.Create(ctx, optedIn("web"))).To(Succeed())
		vm := getVM("web")
		By("guestbackup's webhook injected its cloud-init")
		Expect(vm.Spec.Template.Spec.Volumes).To(ContainElement(And(
			HaveField("Name", mutate.CloudInitVolume),
			HaveField("CloudInitNoCloud.UserDataSecretRef.Name", "web-guestbackup"))))
		By("virt-api's mutator defaulted the same VM: firmware UUID and serial, machine type, architecture")
		spec := vm.Spec.Template.Spec
		Expect(spec.Domain.Firmware).NotTo(BeNil())
		Expect(spec.Domain.Firmware.UUID).NotTo(BeEmpty())
		Expect(spec.Domain.Firmware.Serial).NotTo(BeEmpty())
		Expect(spec.Domain.Machine).To(HaveField("Type", "q35"))
		Expect(spec.Architecture).To(Equal("amd64"))
		Expect(local.InstanceID(vm)).To(Equal(string(spec.Domain.Firmware.UUID)), "the guest's instance-id is the firmware UUID virt-api set")
		Eventually(func() (bool, error) {
			_, ok, err := platform.KubeVirt.Admission(ns, "web")
			return ok, err
		}).WithTimeout(30*time.Second).Should(BeTrue(), "virt-api's log has its admission of the VM")
	})

	It("denies, in the same chain, an opted-in VM with a disk that has no volume", func() {
		vm := optedIn("orphan-disk")
		vm.Spec.Template.Spec.Domain.Devices.Disks = append(vm.Spec.Template.Spec.Domain.Devices.Disks,
			kubevirtv1.Disk{Name: "nowhere", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}})
		err := api.Client.Create(ctx, vm)
		Expect(err).To(MatchError(And(ContainSubstring("virtualmachine-validator.kubevirt.io"), ContainSubstring("nowhere"))))
		Expect(apierrors.IsNotFound(api.Client.Get(ctx, key("orphan-disk"), &kubevirtv1.VirtualMachine{}))).To(BeTrue())
	})

	It("denies, in the same chain, an opted-in VM whose disk serial is too long for KubeVirt", func() {
		vm := optedIn("long-serial")
		// KubeVirt allows 256 characters (virtio shows the guest 20).
		vm.Spec.Template.Spec.Domain.Devices.Disks[0].Serial = strings.Repeat("s", 257)
		err := api.Client.Create(ctx, vm)
		Expect(err).To(MatchError(And(ContainSubstring("virtualmachine-validator.kubevirt.io"), ContainSubstring("disks[0] must be less than or equal to 256 in length"))))
	})

	It("plays the node by the kubelet's and virt-handler's rules: launcher pod Pending then Running, instance Scheduled by virt-controller, Running, Succeeded when stopped", func() {
		var (
			pending    *kubevirtv1.VirtualMachineInstance
			pendingPod *corev1.Pod
		)
		inst, err := platform.StartVM(ctx, GinkgoT(), getVM("web"), local.WhileLauncherPending(func(vmi *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod) {
			pending, pendingPod = vmi, pod
		}))
		Expect(err).NotTo(HaveOccurred())

		By("the launcher pod bound to the node, Pending while the kubelet sets it up; the instance not yet Scheduled")
		Expect(pendingPod.Spec.NodeName).To(Equal(local.NodeName))
		Expect(pendingPod.Status.Phase).To(Equal(corev1.PodPending))
		Expect(pendingPod.Status.StartTime).NotTo(BeNil())
		Expect(pendingPod.Status.ContainerStatuses).To(ContainElement(And(HaveField("Name", "compute"), HaveField("State.Waiting.Reason", "PodInitializing"))))
		Expect(pending.Status.Phase).To(BeElementOf(kubevirtv1.Pending, kubevirtv1.Scheduling))
		_, started := credentials.LauncherStarted(pending)
		Expect(started).To(BeFalse(), "a pending launcher has not read the VM's Secret")

		By("the pod Running; virt-controller's Scheduled on the node, then virt-handler's Running, each with its time")
		Expect(inst.Pod.Status.Phase).To(Equal(corev1.PodRunning))
		Expect(inst.Pod.Status.ContainerStatuses).To(ContainElement(And(HaveField("Name", "compute"), HaveField("State.Running", Not(BeNil())))))
		Expect(inst.VMI.Status.Phase).To(Equal(kubevirtv1.Running))
		Expect(inst.VMI.Status.NodeName).To(Equal(local.NodeName), "virt-controller copies the pod's node")
		var phases []kubevirtv1.VirtualMachineInstancePhase
		for _, t := range inst.VMI.Status.PhaseTransitionTimestamps {
			phases = append(phases, t.Phase)
		}
		Expect(phases).To(Equal([]kubevirtv1.VirtualMachineInstancePhase{kubevirtv1.Pending, kubevirtv1.Scheduling, kubevirtv1.Scheduled, kubevirtv1.Running}))
		at, started := credentials.LauncherStarted(inst.VMI)
		Expect(started).To(BeTrue())
		Expect(at).NotTo(BeTemporally("<", pendingPod.Status.StartTime.Time.Truncate(time.Second)), "the launcher started after the kubelet admitted its pod")

		By("stopping: the instance Succeeded, the pod Succeeded and removed, the instance gone")
		podKey := client.ObjectKeyFromObject(inst.Pod)
		Expect(inst.Stop(ctx)).To(Succeed())
		Expect(apierrors.IsNotFound(api.Client.Get(ctx, key("web"), &kubevirtv1.VirtualMachineInstance{}))).To(BeTrue(), "virt-controller removed its finalizers")
		Expect(apierrors.IsNotFound(api.Client.Get(ctx, podKey, &corev1.Pod{}))).To(BeTrue())
	})

	It("starts and stops a VM the KubeVirt way: virt-controller makes its instance and launcher Pod, with the same firmware UUID at every start", func() {
		vm := getVM("web")
		firmware := local.InstanceID(vm)

		runStrategy("web", kubevirtv1.RunStrategyAlways)
		first := instance("web")
		Expect(metav1.GetControllerOf(first)).To(HaveField("UID", vm.UID), "the VM controls its instance")
		Expect(first.Spec.Domain.Firmware).To(HaveField("UUID", types.UID(firmware)))
		opts, err := platform.RealiseInstance(ctx, first)
		Expect(err).NotTo(HaveOccurred())
		By("KubeVirt's own pkg/cloud-init built the seed, its instance-id the instance's firmware UUID")
		dir := GinkgoT().TempDir()
		out, err := testbed.Run(ctx, time.Minute, dir, nil, "xorriso", "-indev", opts.Seed, "-osirrox", "on", "-extract", "/meta-data", filepath.Join(dir, "meta-data"))
		Expect(err).NotTo(HaveOccurred(), out)
		data, err := os.ReadFile(filepath.Join(dir, "meta-data"))
		Expect(err).NotTo(HaveOccurred())
		var meta map[string]string
		Expect(json.Unmarshal(data, &meta)).To(Succeed(), string(data))
		Expect(meta).To(HaveKeyWithValue("instance-id", firmware))
		Expect(meta).To(HaveKeyWithValue("local-hostname", "web"), "KubeVirt's hostname: the instance's name")
		Eventually(func() ([]corev1.Pod, error) {
			pods := &corev1.PodList{}
			err := api.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{kubevirtv1.AppLabel: "virt-launcher"})
			return pods.Items, err
		}).WithTimeout(time.Minute).ShouldNot(BeEmpty(), "virt-controller asks for a virt-launcher Pod (no node runs it)")

		runStrategy("web", kubevirtv1.RunStrategyHalted)
		Eventually(func() bool {
			return apierrors.IsNotFound(api.Client.Get(ctx, key("web"), &kubevirtv1.VirtualMachineInstance{}))
		}).WithTimeout(time.Minute).Should(BeTrue(), "virt-controller deletes the instance of a halted VM")

		runStrategy("web", kubevirtv1.RunStrategyAlways)
		second := instance("web")
		Expect(second.UID).NotTo(Equal(first.UID))
		Expect(second.Spec.Domain.Firmware).To(HaveField("UUID", types.UID(firmware)), "the firmware UUID, and so the instance-id, is the VM's for life")
		Expect(local.InstanceID(getVM("web"))).To(Equal(firmware))
		started, ok, err := platform.KubeVirt.Start(ns, "web")
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue(), "virt-controller's log has its start of the VM's instance")
		Expect(started.UID).To(Equal(string(vm.UID)), "virt-controller logged the start for the VM")
		runStrategy("web", kubevirtv1.RunStrategyHalted)
	})
})
