package testbed

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubeVirtInstallTimeout bounds a KubeVirt install on the node, from the
// operator's manifest to the KubeVirt CR's Available: about 2 minutes on an
// idle 2-core machine, 8 beside a loaded test run.
const KubeVirtInstallTimeout = 12 * time.Minute

// KubeVirtImages is what hack/kubevirt-images.sh built: KubeVirt's images
// and virt-operator's manifest for one release, and the test guest's image.
type KubeVirtImages struct {
	// Dir is the folder; Version the KubeVirt release.
	Dir, Version string
	// Guest is the test guest's image: a containerDisk (/disk/disk.qcow2)
	// and a kernelBoot container (/boot/vmlinuz, /boot/initrd.img).
	Guest string
}

// LoadKubeVirtImages finds the images of the cluster backend, telling what
// to run when they are not built.
func LoadKubeVirtImages() (KubeVirtImages, error) {
	tools, err := LoadTools()
	if err != nil {
		return KubeVirtImages{}, err
	}
	dir := tools.KubeVirtImages
	recipe, err := readRecipe(filepath.Join(dir, "recipe.txt"))
	if dir == "" || err != nil {
		return KubeVirtImages{}, fmt.Errorf("KubeVirt's images are not built (%q): run `make tools-cluster`", dir)
	}
	return KubeVirtImages{Dir: dir, Version: recipe["kubevirt"], Guest: recipe["guest"]}, nil
}

// Tarballs are the OCI image tarballs to import into a node.
func (k KubeVirtImages) Tarballs() []string {
	var out []string
	for _, name := range []string{"virt-operator", "virt-api", "virt-controller", "virt-handler", "virt-launcher", "guest"} {
		out = append(out, filepath.Join(k.Dir, name+".tar"))
	}
	return out
}

// readRecipe reads a folder's recipe.txt: key=value lines.
func readRecipe(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = v
		}
	}
	return m, sc.Err()
}

// KubeVirtCR is the KubeVirt CR the test bed's admin creates: the release's
// defaults, plus what a one-node cluster without usable KVM needs, each an
// admin's documented setting:
//   - useEmulation: QEMU's TCG where /dev/kvm is absent from launcher pods;
//   - vmRolloutStrategy Stage: the default LiveUpdate gives every VM memory
//     hotplug (<maxMemory slots='0'>), which Debian 12's libvirt 9.0 refuses
//     ("both maximum memory size and memory slot count must be specified");
//   - one replica of virt-api and virt-controller (two on one node only
//     cost CPU);
//   - imagePullPolicy Never, for KubeVirt's components and for launcher
//     pods (spec.configuration's): the images were imported, there is no
//     registry to pull from.
func KubeVirtCR() *kubevirtv1.KubeVirt {
	return &kubevirtv1.KubeVirt{
		TypeMeta:   metav1.TypeMeta{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "KubeVirt"},
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: KubeVirtNamespace},
		Spec: kubevirtv1.KubeVirtSpec{
			ImagePullPolicy: corev1.PullNever,
			Infra:           &kubevirtv1.ComponentConfig{Replicas: ptr.To[uint8](1)},
			Configuration: kubevirtv1.KubeVirtConfiguration{
				DeveloperConfiguration: &kubevirtv1.DeveloperConfiguration{UseEmulation: true},
				ImagePullPolicy:        corev1.PullNever,
				VMRolloutStrategy:      ptr.To(kubevirtv1.VMRolloutStrategyStage),
			},
		},
	}
}

// InstallKubeVirt installs KubeVirt on node n the way users install a
// release: it imports the images (where a cluster would pull them), applies
// virt-operator's manifest, creates the KubeVirt CR, and waits until
// virt-operator reports it Available: virt-api, virt-controller and
// virt-handler then run as the operator deployed them. The node must allow
// privileged pods (NodeOptions.AllowPrivileged): virt-handler's are.
func InstallKubeVirt(tb TB, n *Node, images KubeVirtImages) error {
	tb.Helper()
	start := time.Now()
	for _, tarball := range images.Tarballs() {
		if err := n.ImportImage(tarball); err != nil {
			return err
		}
	}
	imported := time.Since(start)
	ctx := context.Background()
	// virt-operator runs on control-plane nodes only (its Deployment
	// requires the role's label). This node is the cluster's only one and
	// runs beside its control plane, so it carries the label kubeadm gives
	// such a node (and, as a one-node kubeadm cluster, no taint).
	node := &corev1.Node{}
	if err := n.API.Client.Get(ctx, client.ObjectKey{Name: n.Name}, node); err != nil {
		return err
	}
	patch := client.MergeFrom(node.DeepCopy())
	metav1.SetMetaDataLabel(&node.ObjectMeta, "node-role.kubernetes.io/control-plane", "")
	if err := n.API.Client.Patch(ctx, node, patch); err != nil {
		return fmt.Errorf("label node %s a control-plane node: %w", n.Name, err)
	}
	objs, err := readManifests(filepath.Join(images.Dir, "kubevirt-operator.yaml"))
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := n.API.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	// The CRD must be served before its first object.
	if err := WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
		err := n.API.Client.Create(ctx, KubeVirtCR())
		// A create that reached the server before its answer was lost.
		return err == nil || apierrors.IsAlreadyExists(err), err
	}); err != nil {
		return fmt.Errorf("create the KubeVirt CR: %w", err)
	}
	if err := WaitFor(KubeVirtInstallTimeout, 2*time.Second, func() (bool, error) {
		return kubeVirtAvailable(ctx, n.API.Client)
	}); err != nil {
		return fmt.Errorf("KubeVirt %s did not become Available in %v: %w\n%s", images.Version, KubeVirtInstallTimeout, err,
			DescribePods(ctx, n.API.Client, KubeVirtNamespace))
	}
	// Available says virt-api runs, not that its webhooks answer in time:
	// its first admissions wait for its informers. A dry-run VM goes
	// through them as an owner's would.
	if err := WaitFor(3*time.Minute, 2*time.Second, func() (bool, error) {
		err := n.API.Client.Create(ctx, probeVM(), client.DryRunAll)
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("KubeVirt %s is Available but does not admit a VirtualMachine: %w", images.Version, err)
	}
	tb.Logf("KubeVirt %s installed on node %s in %v (images imported in %v)", images.Version, n.Name,
		time.Since(start).Round(time.Second), imported.Round(time.Second))
	return nil
}

// kubeVirtAvailable tells whether the KubeVirt CR is Deployed and
// Available, and if not, what it says.
func kubeVirtAvailable(ctx context.Context, c client.Client) (bool, error) {
	kv := &kubevirtv1.KubeVirt{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: KubeVirtNamespace, Name: "kubevirt"}, kv); err != nil {
		return false, err
	}
	var said []string
	for _, cond := range kv.Status.Conditions {
		if cond.Type == kubevirtv1.KubeVirtConditionAvailable && cond.Status == corev1.ConditionTrue && kv.Status.Phase == kubevirtv1.KubeVirtPhaseDeployed {
			return true, nil
		}
		said = append(said, fmt.Sprintf("%s=%s (%s: %s)", cond.Type, cond.Status, cond.Reason, cond.Message))
	}
	return false, fmt.Errorf("KubeVirt is %q: %s", kv.Status.Phase, strings.Join(said, "; "))
}

// DescribePods says, for every pod in namespace, what `kubectl describe`
// would say first: phase, unmet conditions, containers that do not run.
func DescribePods(ctx context.Context, c client.Client, namespace string) string {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return fmt.Sprintf("list pods in %s: %v", namespace, err)
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s/%s: %s\n", p.Namespace, p.Name, DescribePod(&p))
	}
	if len(pods.Items) == 0 {
		fmt.Fprintf(&b, "no pods in %s\n", namespace)
	}
	return b.String()
}

// DescribePod says what `kubectl describe pod` shows of a pod that does
// not run: its phase, unmet conditions, and each container's readiness,
// restarts, wait and last exit.
func DescribePod(p *corev1.Pod) string {
	parts := []string{string(p.Status.Phase)}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			parts = append(parts, fmt.Sprintf("%s=%s %s %s", cond.Type, cond.Status, cond.Reason, cond.Message))
		}
	}
	for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		part := fmt.Sprintf("container %s ready=%v restarts=%d", s.Name, s.Ready, s.RestartCount)
		if w := s.State.Waiting; w != nil {
			part += fmt.Sprintf(" waiting %s: %s", w.Reason, w.Message)
		}
		if t := s.State.Terminated; t != nil && t.ExitCode != 0 {
			part += fmt.Sprintf(" exited %d %s: %s", t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
		}
		if t := s.LastTerminationState.Terminated; t != nil {
			part += fmt.Sprintf(" last exit %d %s: %s", t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

// probeVM is the smallest VirtualMachine KubeVirt's webhooks admit.
func probeVM() *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-probe", Namespace: KubeVirtNamespace},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Resources: kubevirtv1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
				}},
			}},
		},
	}
}
