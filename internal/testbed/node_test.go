package testbed

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestNodeHasNamespacesOfItsOwn: a real node runs in PID and mount
// namespaces of its own, as KubeVirt needs: in a privileged hostPID pod
// (virt-handler's kind) PID 1 is the node's init, whose mount namespace can
// be read; the kubelet's root is /var/lib/kubelet there; the node carries
// the TTL annotation; and the machine's own /var/lib/kubelet,
// /var/run/kubevirt, /var/run/netns and the like stay as they were. Once the
// node stops nothing of it is left: no process, no mount, no network
// namespace file, no bridge, no cgroup, no folder.
func TestNodeHasNamespacesOfItsOwn(t *testing.T) {
	tools, err := LoadTools()
	if err == nil {
		err = nodeTools(tools)
	}
	if err != nil {
		t.Skipf("no real node on this machine (run `make tools`): %v", err)
	}
	watched := []string{"/var/lib/kubelet", "/var/run/kubevirt", "/var/run/netns", "/run/containerd", "/var/lib/cni", "/var/log/containers"}
	before := map[string][]string{}
	for _, d := range watched {
		before[d] = dirEntries(t, d)
	}
	hostMountNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}

	var n *Node
	var nodeMountNS, nodePIDNS string
	t.Run("node", func(t *testing.T) {
		n = StartNode(t, NodeOptions{AllowPrivileged: true})
		ctx := context.Background()
		if nodeMountNS, err = os.Readlink(filepath.Join("/proc", strconv.Itoa(n.init), "ns", "mnt")); err != nil {
			t.Fatal(err)
		}
		if nodePIDNS, err = os.Readlink(filepath.Join("/proc", strconv.Itoa(n.init), "ns", "pid")); err != nil {
			t.Fatal(err)
		}
		if nodeMountNS == hostMountNS {
			t.Fatalf("the node's init is in the test's mount namespace %s", hostMountNS)
		}
		inNode := func(args ...string) string {
			t.Helper()
			out, err := Run(ctx, time.Minute, "", nil, "/usr/bin/nsenter", append([]string{"--target", strconv.Itoa(n.init), "--pid", "--mount", "--"}, args...)...)
			if err != nil {
				t.Fatalf("in the node: %v\n%s", err, out)
			}
			return strings.TrimSpace(out)
		}
		if comm := inNode("cat", "/proc/1/comm"); comm != "tini" {
			t.Errorf("the node's PID 1 is %q, want tini", comm)
		}
		if ns := inNode("readlink", "/proc/1/ns/mnt"); ns != nodeMountNS {
			t.Errorf("in the node /proc/1/ns/mnt is %q, want the node's %s", ns, nodeMountNS)
		}
		t.Logf("node %s: init (tini) is host PID %d, %s, %s; the test's is %s", n.Name, n.init, nodePIDNS, nodeMountNS, hostMountNS)

		// The kubelet's device manager serves its socket in the fixed
		// /var/lib/kubelet/device-plugins, where virt-handler registers.
		if err := WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
			_, err := os.Stat(filepath.Join(n.dir, "root", "var", "lib", "kubelet", "device-plugins", "kubelet.sock"))
			return err == nil, err
		}); err != nil {
			t.Errorf("the kubelet's device manager socket in the node's folder: %v", err)
		}
		inNode("test", "-S", "/var/lib/kubelet/device-plugins/kubelet.sock")

		// A privileged hostPID pod, run as root: virt-handler's kind.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "handler", Namespace: metav1.NamespaceDefault},
			Spec: corev1.PodSpec{
				HostPID:                      true,
				AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{
					Name: "pause", Image: sandboxImage, ImagePullPolicy: corev1.PullNever,
					SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To(int64(0))},
					VolumeMounts:    []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
				}},
				Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}},
			},
		}
		if err := n.API.Client.Create(ctx, pod); err != nil {
			t.Fatalf("create a privileged pod: %v", err)
		}
		if err := WaitFor(2*time.Minute, 500*time.Millisecond, func() (bool, error) {
			if err := n.API.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
				return false, err
			}
			return pod.Status.Phase == corev1.PodRunning, nil
		}); err != nil {
			t.Fatalf("pod %s: %v (phase %s)", pod.Name, err, pod.Status.Phase)
		}
		pid, err := n.ContainerPID(pod, "pause")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the hostPID pod's container is host PID %d", pid)
		proc := filepath.Join("/proc", strconv.Itoa(pid))
		if cmdline, err := os.ReadFile(filepath.Join(proc, "cmdline")); err != nil || !bytes.Contains(cmdline, []byte("pause")) {
			t.Errorf("host PID %d of the container runs %q (%v), want the pause binary", pid, cmdline, err)
		}
		if ns, err := os.Readlink(filepath.Join(proc, "ns", "pid")); err != nil || ns != nodePIDNS {
			t.Errorf("the hostPID container's PID namespace is %q (%v), want the node's %s", ns, err, nodePIDNS)
		}
		// What virt-chroot --mount /proc/1/ns/mnt opens, seen through the
		// container's own /proc.
		if ns, err := os.Readlink(filepath.Join(proc, "root", "proc", "1", "ns", "mnt")); err != nil || ns != nodeMountNS {
			t.Errorf("in the hostPID pod /proc/1/ns/mnt is %q (%v), want the node's %s", ns, err, nodeMountNS)
		}

		// The pod's mounts are the node's; none is the host's.
		nodeMounts := mountPoints(t, filepath.Join("/proc", strconv.Itoa(n.init), "mountinfo"))
		for _, want := range []string{"/var/lib/kubelet", "/var/lib/kubelet/pods/" + string(pod.UID) + "/volumes/kubernetes.io~empty-dir/scratch"} {
			if !slices.Contains(nodeMounts, want) {
				t.Errorf("the node has no mount on %s", want)
			}
		}
		if !slices.ContainsFunc(nodeMounts, func(m string) bool { return strings.HasPrefix(m, "/run/netns/cni-") }) {
			t.Errorf("the node has no network namespace mounted under /run/netns: %v", nodeMounts)
		}
		if netns := dirEntries(t, filepath.Join(n.dir, "root", "var", "run", "netns")); len(netns) == 0 {
			t.Error("the node's own /var/run/netns is empty while a pod runs")
		}
		checkHostUntouched(t, n, before)

		if err := WaitFor(time.Minute, 500*time.Millisecond, func() (bool, error) {
			var node corev1.Node
			if err := n.API.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
				return false, err
			}
			_, ok := node.Annotations["node.alpha.kubernetes.io/ttl"]
			return ok, nil
		}); err != nil {
			t.Errorf("node %s has no node.alpha.kubernetes.io/ttl annotation: %v", n.Name, err)
		}
	})
	if n == nil || nodeMountNS == "" {
		return
	}

	// The node's cleanup ran.
	if procs, err := processes(); err != nil {
		t.Fatal(err)
	} else {
		for pid := range procs {
			if ns, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "pid")); ns == nodePIDNS {
				t.Errorf("process %d is still in the node's PID namespace", pid)
			}
			if ns, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "mnt")); ns == nodeMountNS {
				t.Errorf("process %d is still in the node's mount namespace", pid)
			}
		}
	}
	checkHostUntouched(t, n, before)
	if _, err := os.Stat(n.dir); !os.IsNotExist(err) {
		t.Errorf("the node's folder %s is still there: %v", n.dir, err)
	}
	if out, err := Run(context.Background(), 30*time.Second, "", nil, "ip", "link", "show", n.bridge); err == nil {
		t.Errorf("bridge %s is still there:\n%s", n.bridge, out)
	}
	for _, h := range cgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, n.cgroup)); !os.IsNotExist(err) {
			t.Errorf("cgroup %s is still there: %v", filepath.Join(h, n.cgroup), err)
		}
	}
}

// checkHostUntouched fails when the host's mount table holds a mount of the
// node's, or a watched folder of the host's changed.
func checkHostUntouched(t *testing.T, n *Node, before map[string][]string) {
	t.Helper()
	private := []string{n.dir}
	for _, p := range nodePrivatePaths {
		private = append(private, p)
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			private = append(private, resolved)
		}
	}
	for _, m := range mountPoints(t, "/proc/self/mountinfo") {
		for _, p := range private {
			if m == p || strings.HasPrefix(m, p+"/") {
				t.Errorf("the host has a mount on %s", m)
			}
		}
	}
	for d, was := range before {
		if now := dirEntries(t, d); !slices.Equal(now, was) {
			t.Errorf("the host's %s holds %v, held %v", d, now, was)
		}
	}
}

// dirEntries are the names in a folder; none when it does not exist.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// mountPoints are the mount points a mountinfo file lists.
func mountPoints(t *testing.T, mountinfo string) []string {
	t.Helper()
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 4 {
			points = append(points, f[4])
		}
	}
	return points
}
