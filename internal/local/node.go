package local

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// NodeName is the node the test bed plays for KubeVirt: the scheduler binds
// virt-launcher pods to it, and its kubelet and virt-handler are the test
// bed's (see node). No other kubelet serves it.
const NodeName = "kubevirt-node"

// nodeLabels are the labels of the node: the kubelet's own (hostname, OS,
// architecture), and those virt-handler and its node labeller keep on a
// node they serve (schedulable; the machine types qemu offers), which
// virt-controller's launcher pods select.
var nodeLabels = map[string]string{
	corev1.LabelHostname: NodeName, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64",
	kubevirtv1.NodeSchedulable: "true", kubevirtv1.SupportedMachineTypeLabel + "q35": "true",
}

// registerNode creates the Node, as a kubelet registers its node and
// virt-handler labels it. It carries no virt-handler heartbeat: without one
// virt-controller's node controller counts the node as responsive.
func registerNode(ctx context.Context, c client.Client) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: nodeLabels}}
	if err := c.Create(ctx, node); err != nil {
		return fmt.Errorf("register node %s: %w", NodeName, err)
	}
	return nil
}

// node plays, for one instance, the parts of a cluster that run on a node,
// by their rules (see test/kubevirt/README.md):
//
//   - kube-scheduler: it binds the instance's virt-launcher pod to NodeName
//     (pods/binding), if the pod's nodeSelector matches the node;
//   - the kubelet: it reports the pod Pending (startTime, containers
//     waiting in PodInitializing), then Running (init containers
//     completed, containers running and ready) once the pod's volumes, the
//     Secrets among them, are read; and, when virt-controller deletes the
//     pod, Succeeded, then removes it as a kubelet does (grace period 0);
//   - virt-handler: once virt-controller moved the instance to Scheduled
//     (as it does when the pod's compute container runs), it reports the
//     instance Running, and Succeeded when its guest shut down; each with
//     its phase transition time, as controller.SetVMIPhaseTransitionTimestamp
//     records it.
//
// virt-controller's own parts (Pending, Scheduling, Scheduled, the pod's
// creation and deletion, the instance's finalizers) are virt-controller's.
type node struct {
	// c is the kubelet's client (the API's admin: the test bed runs no
	// node authorizer); handler is virt-handler's.
	c, handler client.Client
	vmi        *kubevirtv1.VirtualMachineInstance
	pod        *corev1.Pod
	// guest is the instance's qemu guest, once it booted.
	guest *testbed.Guest
}

// launcherPod waits for virt-controller's virt-launcher pod of vmi.
func launcherPod(ctx context.Context, c client.Client, vmi *kubevirtv1.VirtualMachineInstance) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := waitFor(instanceTimeout, func() (bool, error) {
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace(vmi.Namespace), client.MatchingLabels{kubevirtv1.CreatedByLabel: string(vmi.UID)}); err != nil {
			return false, err
		}
		for i := range pods.Items {
			if owner := metav1.GetControllerOf(&pods.Items[i]); owner != nil && owner.UID == vmi.UID {
				pod = &pods.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("virt-controller made no virt-launcher pod for VirtualMachineInstance %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return pod, nil
}

// schedule binds the pod to NodeName, then reports it as the kubelet does
// when it admits a pod: Pending since now, its containers being created.
func (n *node) schedule(ctx context.Context) error {
	if sel := n.pod.Spec.NodeSelector; !labels.SelectorFromSet(sel).Matches(labels.Set(nodeLabels)) {
		return fmt.Errorf("virt-launcher pod %s/%s selects nodes %v: node %s (%v) does not match", n.pod.Namespace, n.pod.Name, sel, NodeName, nodeLabels)
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: n.pod.Name, Namespace: n.pod.Namespace},
		Target:     corev1.ObjectReference{Kind: "Node", Name: NodeName},
	}
	if err := n.c.SubResource("binding").Create(ctx, n.pod, binding); err != nil {
		return fmt.Errorf("bind pod %s/%s to node %s: %w", n.pod.Namespace, n.pod.Name, NodeName, err)
	}
	return n.podStatus(ctx, func(s *corev1.PodStatus) {
		now := metav1.Now()
		s.Phase, s.StartTime, s.HostIP = corev1.PodPending, &now, "127.0.0.1"
		s.HostIPs = []corev1.HostIP{{IP: s.HostIP}}
		setPodCondition(s, corev1.PodReadyToStartContainers, corev1.ConditionFalse, "")
		setPodCondition(s, corev1.PodInitialized, corev1.ConditionFalse, "ContainersNotInitialized")
		setPodCondition(s, corev1.ContainersReady, corev1.ConditionFalse, "ContainersNotReady")
		setPodCondition(s, corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady")
		s.InitContainerStatuses = containerStatuses(n.pod.Spec.InitContainers, func(corev1.Container) corev1.ContainerState {
			return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
		}, false)
		s.ContainerStatuses = containerStatuses(n.pod.Spec.Containers, func(corev1.Container) corev1.ContainerState {
			return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
		}, false)
	})
}

// run reports the pod Running as the kubelet does once its volumes are set
// up and its containers started: init containers completed, containers
// running and ready (virt-launcher's have no readiness probe here).
func (n *node) run(ctx context.Context) error {
	return n.podStatus(ctx, func(s *corev1.PodStatus) {
		now := metav1.Now()
		s.Phase = corev1.PodRunning
		for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			setPodCondition(s, t, corev1.ConditionTrue, "")
		}
		s.InitContainerStatuses = containerStatuses(n.pod.Spec.InitContainers, func(corev1.Container) corev1.ContainerState {
			return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: now, FinishedAt: now}}
		}, false)
		s.ContainerStatuses = containerStatuses(n.pod.Spec.Containers, func(corev1.Container) corev1.ContainerState {
			return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		}, true)
	})
}

// scheduled waits until virt-controller moved the instance to Scheduled on
// NodeName, which it does once it sees the pod's compute container run.
func (n *node) scheduled(ctx context.Context) error {
	err := waitFor(instanceTimeout, func() (bool, error) {
		if err := n.c.Get(ctx, client.ObjectKeyFromObject(n.vmi), n.vmi); err != nil {
			return false, err
		}
		if n.vmi.IsFinal() {
			return false, fmt.Errorf("instance is %s", n.vmi.Status.Phase)
		}
		return n.vmi.IsScheduled() && n.vmi.Status.NodeName == NodeName, nil
	})
	if err != nil {
		return fmt.Errorf("virt-controller did not schedule VirtualMachineInstance %s/%s on node %s (phase %s): %w",
			n.vmi.Namespace, n.vmi.Name, NodeName, n.vmi.Status.Phase, err)
	}
	return nil
}

// running reports the instance Running, as virt-handler does once the
// domain runs.
func (n *node) running(ctx context.Context) error {
	return n.instanceStatus(ctx, func(vmi *kubevirtv1.VirtualMachineInstance) {
		vmi.Status.Phase = kubevirtv1.Running
		setInstanceCondition(&vmi.Status, kubevirtv1.VirtualMachineInstanceReady, corev1.ConditionTrue)
	})
}

// stopped plays the node after the VM was stopped (runStrategy Halted):
// once virt-controller deleted the instance, the guest is stopped if it
// still runs (virt-launcher shuts its domain down) and virt-handler reports
// the instance Succeeded; the kubelet reports the pod Succeeded once
// virt-controller deleted it, then removes it. virt-controller then
// removes the instance's finalizers.
func (n *node) stopped(ctx context.Context) error {
	err := waitFor(instanceTimeout, func() (bool, error) {
		err := n.c.Get(ctx, client.ObjectKeyFromObject(n.vmi), n.vmi)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && n.vmi.DeletionTimestamp != nil, err
	})
	if err != nil {
		return fmt.Errorf("virt-controller did not delete VirtualMachineInstance %s/%s: %w", n.vmi.Namespace, n.vmi.Name, err)
	}
	if n.guest != nil {
		n.guest.Process.Stop()
	}
	err = n.instanceStatus(ctx, func(vmi *kubevirtv1.VirtualMachineInstance) {
		vmi.Status.Phase = kubevirtv1.Succeeded
		setInstanceCondition(&vmi.Status, kubevirtv1.VirtualMachineInstanceReady, corev1.ConditionFalse)
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = waitFor(instanceTimeout, func() (bool, error) {
		err := n.c.Get(ctx, client.ObjectKeyFromObject(n.pod), n.pod)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && n.pod.DeletionTimestamp != nil, err
	})
	if err != nil {
		return fmt.Errorf("virt-controller did not delete virt-launcher pod %s/%s: %w", n.pod.Namespace, n.pod.Name, err)
	}
	err = n.podStatus(ctx, func(s *corev1.PodStatus) {
		now := metav1.Now()
		s.Phase = corev1.PodSucceeded
		for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.ContainersReady, corev1.PodReady} {
			setPodCondition(s, t, corev1.ConditionFalse, "PodCompleted")
		}
		s.ContainerStatuses = containerStatuses(n.pod.Spec.Containers, func(c corev1.Container) corev1.ContainerState {
			started := now
			for _, cs := range n.pod.Status.ContainerStatuses {
				if cs.Name == c.Name && cs.State.Running != nil {
					started = cs.State.Running.StartedAt
				}
			}
			return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: started, FinishedAt: now}}
		}, false)
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// The kubelet's last word on a terminated pod: delete it now, only
	// this very pod.
	err = n.c.Delete(ctx, n.pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &n.pod.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove terminated pod %s/%s: %w", n.pod.Namespace, n.pod.Name, err)
	}
	err = waitFor(instanceTimeout, func() (bool, error) {
		err := n.c.Get(ctx, client.ObjectKeyFromObject(n.vmi), &kubevirtv1.VirtualMachineInstance{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("virt-controller did not finish deleting VirtualMachineInstance %s/%s: %w", n.vmi.Namespace, n.vmi.Name, err)
	}
	return nil
}

// podStatus changes the pod's status, as the kubelet writes it.
func (n *node) podStatus(ctx context.Context, change func(*corev1.PodStatus)) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if err := n.c.Get(ctx, client.ObjectKeyFromObject(n.pod), n.pod); err != nil {
			return err
		}
		change(&n.pod.Status)
		return n.c.Status().Update(ctx, n.pod)
	})
	if err != nil {
		return fmt.Errorf("status of pod %s/%s: %w", n.pod.Namespace, n.pod.Name, err)
	}
	return nil
}

// instanceStatus changes the instance's status as virt-handler writes it:
// an update of the instance (KubeVirt's instances have no status
// subresource) as virt-handler's user, since virt-api drops other users'
// changes of the status. It records the time of a phase change. It reads
// the instance as the admin: virt-handler's role may only list and watch
// (it reads from its informer's cache).
func (n *node) instanceStatus(ctx context.Context, change func(*kubevirtv1.VirtualMachineInstance)) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if err := n.c.Get(ctx, client.ObjectKeyFromObject(n.vmi), n.vmi); err != nil {
			return err
		}
		was := n.vmi.Status.Phase
		change(n.vmi)
		phase := n.vmi.Status.Phase
		if n.vmi.Status.Phase != was {
			n.vmi.Status.PhaseTransitionTimestamps = append(n.vmi.Status.PhaseTransitionTimestamps, kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{
				Phase: n.vmi.Status.Phase, PhaseTransitionTimestamp: metav1.Now(),
			})
		}
		if err := n.handler.Update(ctx, n.vmi); err != nil {
			return err
		}
		if n.vmi.Status.Phase != phase {
			return fmt.Errorf("virt-api kept the instance's phase %s, not %s", n.vmi.Status.Phase, phase)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("status of VirtualMachineInstance %s/%s: %w", n.vmi.Namespace, n.vmi.Name, err)
	}
	return nil
}

// containerStatuses are the statuses of containers, each in the state
// state gives it.
func containerStatuses(containers []corev1.Container, state func(corev1.Container) corev1.ContainerState, ready bool) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, 0, len(containers))
	for _, c := range containers {
		s := state(c)
		out = append(out, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, State: s, Ready: ready,
			Started: ptr.To(s.Running != nil),
		})
	}
	return out
}

// setPodCondition sets a pod condition, its transition time when its
// status changes.
func setPodCondition(s *corev1.PodStatus, t corev1.PodConditionType, status corev1.ConditionStatus, reason string) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			if s.Conditions[i].Status != status {
				s.Conditions[i].LastTransitionTime = metav1.Now()
			}
			s.Conditions[i].Status, s.Conditions[i].Reason = status, reason
			return
		}
	}
	s.Conditions = append(s.Conditions, corev1.PodCondition{Type: t, Status: status, Reason: reason, LastTransitionTime: metav1.Now()})
}

// setInstanceCondition sets an instance condition, as virt-handler does.
func setInstanceCondition(s *kubevirtv1.VirtualMachineInstanceStatus, t kubevirtv1.VirtualMachineInstanceConditionType, status corev1.ConditionStatus) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			if s.Conditions[i].Status != status {
				s.Conditions[i].LastTransitionTime = metav1.Now()
			}
			s.Conditions[i].Status = status
			return
		}
	}
	s.Conditions = append(s.Conditions, kubevirtv1.VirtualMachineInstanceCondition{Type: t, Status: status, LastTransitionTime: metav1.Now()})
}

// waitFor polls done until it is true, bounded by timeout.
func waitFor(timeout time.Duration, done func() (bool, error)) error {
	return testbed.WaitFor(timeout, 50*time.Millisecond, done)
}
