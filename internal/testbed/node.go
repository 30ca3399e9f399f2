package testbed

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// nodeControllers are the kube-controller-manager controllers a node's
// pods need, and no others: node lifecycle lifts the not-ready taint,
// Deployments and ReplicaSets make pods, EndpointSlices and Endpoints let the
// API server route to a webhook pod, service accounts and the root CA
// ConfigMap give pods their API credentials, the binder binds claims to
// volumes, and the garbage collector deletes what owners leave behind. The
// TTL controller annotates the node with node.alpha.kubernetes.io/ttl, as on
// any cluster: KubeVirt's node-restriction ValidatingAdmissionPolicy
// (kubevirt-node-restriction-policy, which virt-operator installs) expects
// a node to carry it. Jobs and DaemonSets are how virt-operator installs
// KubeVirt: a Job posts its install strategy, and virt-handler is a
// DaemonSet.
var nodeControllers = []string{
	"node-lifecycle-controller", "deployment-controller", "replicaset-controller",
	"endpointslice-controller", "endpoints-controller", "serviceaccount-controller",
	"root-ca-certificate-publisher-controller", "persistentvolume-binder-controller",
	"garbage-collector-controller", "pod-garbage-collector-controller", "ttl-controller",
	"job-controller", "daemonset-controller",
}

// NodeOptions adjust StartNode.
type NodeOptions struct {
	// APIServer adjusts the cluster's API server (its Configure is StartNode's).
	APIServer APIServerOptions
	// Images are OCI image tarballs (as `make image` writes them) to import
	// into the node, under the names their layout gives plus Tags.
	Images []string
	// AllowPrivileged lets pods run privileged containers (the API server's
	// --allow-privileged), as KubeVirt's virt-handler DaemonSet needs. Off,
	// the API server refuses them: the suites that install guestbackup's
	// chart keep proving it runs unprivileged.
	AllowPrivileged bool
}

// Node is a one-node Kubernetes cluster on this machine: the test bed's API
// server, kube-scheduler, kube-controller-manager, and a kubelet driving a
// private containerd with runc and a CNI bridge. Its pods are real pods:
// the kubelet pulls nothing (images are imported, pods use
// imagePullPolicy Never or IfNotPresent), mounts volumes, applies
// securityContext and fsGroup, runs probes and restarts containers.
//
// Networking: pods live on a bridge of the test bed's own with a /24 of
// 10.0.0.0/8 nobody else on the machine routes. The API server serves on
// the first address of the Service range, which is the ClusterIP of Service
// default/kubernetes, assigned to that bridge: pods reach the API server at
// KUBERNETES_SERVICE_HOST exactly as through kube-proxy, and the host
// reaches pod IPs through the bridge. The API server calls webhooks and
// other Services at their endpoints (--enable-aggregator-routing), so no
// kube-proxy rewrites the machine's firewall. No cluster DNS runs.
//
// Namespaces: containerd and the kubelet run in PID and mount namespaces of
// the node's own, under tini as PID 1, as on a real (or kind) node whose
// PID 1 is the node's init: hostPID pods see the node's processes, and
// KubeVirt's virt-handler can enter /proc/1/ns/mnt. The kubelet's root is
// /var/lib/kubelet there, and the machine's paths a kubelet, containerd or
// KubeVirt hard-code are the node's own folders (nodePrivatePaths). The
// network namespace is the host's. See startInit.
type Node struct {
	// Name is the Node object's name.
	Name string
	// API is the cluster's API server.
	API *APIServer
	// PodCIDR is the pods' subnet; Gateway is the bridge's address in it.
	PodCIDR *net.IPNet
	Gateway net.IP
	// serviceCIDR is the Services' subnet, whose first address (the API
	// server's) is on the bridge too.
	serviceCIDR *net.IPNet

	dir, socket string
	bridge      string
	cgroup      string
	// init is the host PID of the node's init (tini), PID 1 of the node's
	// PID namespace, in its mount namespace; initProcess is the unshare
	// that started it (see startInit).
	init        int
	initProcess *Process
	// control are the scheduler and controller manager: stopped first at
	// cleanup, so that no pod is made again while the node drains.
	control []*Process
	// helmHome and kubeconfig are Helm's, made at its first use.
	helmHome, kubeconfig string
}

// nodeNetwork is a bridge and two /24 subnets claimed for one node.
type nodeNetwork struct {
	bridge         string
	service, pods  *net.IPNet
	apiIP, gateway net.IP
}

// StartNode starts a cluster with one real node and waits until the node is
// Ready and untainted. Everything it starts is stopped by the test's
// cleanup: the pods drained through the kubelet, then the node's init,
// whose end takes every process of the node's PID namespace and every
// mount of its mount namespace (pods' volumes, network namespaces) with it;
// then its cgroups and its bridge are removed.
func StartNode(tb TB, opts NodeOptions) *Node {
	tb.Helper()
	tools := MustTools(tb)
	if err := nodeTools(tools); err != nil {
		tb.Fatalf("%v", err)
	}
	dir := tb.TempDir()
	// Unix socket paths are limited to 108 bytes; the test's folder is short.
	netw, err := claimNetwork(tb)
	if err != nil {
		tb.Fatalf("node network: %v", err)
	}
	n := &Node{Name: "node-" + netw.bridge, PodCIDR: netw.pods, Gateway: netw.gateway, serviceCIDR: netw.service, dir: dir,
		socket: filepath.Join(dir, "containerd.sock"), bridge: netw.bridge, cgroup: "/guestbackup-" + netw.bridge}

	apiOpts := opts.APIServer
	apiOpts.Configure = func(env *envtest.Environment) error {
		s := env.ControlPlane.GetAPIServer()
		// Served on the `kubernetes` Service's ClusterIP, on the bridge.
		s.SecureServing.Address = netw.apiIP.String()
		s.SecureServing.Port = "443"
		args := s.Configure()
		args.Set("advertise-address", netw.apiIP.String())
		args.Set("service-cluster-ip-range", netw.service.String())
		args.Set("enable-aggregator-routing", "true")
		// envtest turns the ServiceAccount admission plugin off because it
		// runs no controller manager; this cluster runs one, and pods get
		// their service account's token as on any cluster.
		args.Set("disable-admission-plugins", "StorageObjectInUseProtection")
		args.Set("allow-privileged", strconv.FormatBool(opts.AllowPrivileged))
		return nil
	}
	n.API = StartAPIServer(tb, apiOpts)
	if err := n.start(tb, tools, opts); err != nil {
		tb.Fatalf("start node: %v", err)
	}
	return n
}

func (n *Node) start(tb TB, tools Tools, opts NodeOptions) error {
	ctx := context.Background()
	// envtest authorizes with RBAC only (no Node authorizer): the nodes'
	// group gets the role the Node authorizer's rules are written for.
	if err := n.API.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "testbed:nodes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
	}); err != nil {
		return fmt.Errorf("bind system:nodes: %w", err)
	}
	caFile := filepath.Join(n.dir, "ca.crt")
	if err := os.WriteFile(caFile, n.API.Config.CAData, 0o600); err != nil {
		return err
	}
	kubeconfig := func(name string, groups ...string) (string, error) {
		user, err := n.API.Env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
		if err != nil {
			return "", fmt.Errorf("user %s: %w", name, err)
		}
		data, err := user.KubeConfig()
		if err != nil {
			return "", err
		}
		path := filepath.Join(n.dir, strings.ReplaceAll(name, ":", "-")+".kubeconfig")
		return path, os.WriteFile(path, data, 0o600)
	}

	if err := n.startContainerd(tb, tools); err != nil {
		return err
	}
	for _, image := range append([]string{tools.PauseImage}, opts.Images...) {
		if err := n.ImportImage(image); err != nil {
			return err
		}
	}

	cm, err := kubeconfig("system:kube-controller-manager")
	if err != nil {
		return err
	}
	kcm := StartProcess(tb, ProcessSpec{Name: "kube-controller-manager", Path: tools.KubeControllerManager, Args: []string{
		"--kubeconfig=" + cm, "--authentication-kubeconfig=" + cm, "--authorization-kubeconfig=" + cm,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
		// Each controller acts with its own service account's RBAC, as in
		// kubeadm's clusters.
		"--use-service-account-credentials=true",
		"--controllers=" + strings.Join(nodeControllers, ","),
		"--root-ca-file=" + caFile,
		"--cluster-name=" + n.Name,
	}})
	sched, err := kubeconfig("system:kube-scheduler")
	if err != nil {
		return err
	}
	scheduler := StartProcess(tb, ProcessSpec{Name: "kube-scheduler", Path: tools.KubeScheduler, Args: []string{
		"--kubeconfig=" + sched, "--authentication-kubeconfig=" + sched, "--authorization-kubeconfig=" + sched,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
	}})
	n.control = []*Process{kcm, scheduler}

	kubelet, err := kubeconfig("system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	if err := n.startKubelet(tb, tools, kubelet); err != nil {
		return err
	}
	return n.waitReady()
}

// nodeTools fails when one of the programs the real node runs is missing.
func nodeTools(tools Tools) error {
	for name, path := range map[string]string{"kubelet": tools.Kubelet, "kube-scheduler": tools.KubeScheduler,
		"kube-controller-manager": tools.KubeControllerManager, "pause image": tools.PauseImage,
		"containerd": "/usr/bin/containerd", "ctr": "/usr/bin/ctr", "runc": "/usr/sbin/runc", "CNI bridge plugin": "/usr/lib/cni/bridge",
		"tini": "/usr/bin/tini", "unshare": "/usr/bin/unshare", "nsenter": "/usr/bin/nsenter"} {
		if _, err := os.Stat(path); path == "" || err != nil {
			return fmt.Errorf("the real node's %s is not installed (%q): run `make tools`", name, path)
		}
	}
	return nil
}

// claimNetwork picks two free /24s (Services, pods) and claims them by
// creating the bridge named after them: `ip link add` fails when another
// test bed holds it.
func claimNetwork(tb TB) (*nodeNetwork, error) {
	used, err := routedNets()
	if err != nil {
		return nil, err
	}
	for range 50 {
		a, err := rand.Int(rand.Reader, big.NewInt(50))
		if err != nil {
			return nil, err
		}
		b, err := rand.Int(rand.Reader, big.NewInt(127))
		if err != nil {
			return nil, err
		}
		x, y := 200+int(a.Int64()), 2*int(b.Int64())
		n := &nodeNetwork{
			bridge:  fmt.Sprintf("gbnode%d-%d", x, y),
			service: &net.IPNet{IP: net.IPv4(10, byte(x), byte(y), 0).To4(), Mask: net.CIDRMask(24, 32)},
			pods:    &net.IPNet{IP: net.IPv4(10, byte(x), byte(y+1), 0).To4(), Mask: net.CIDRMask(24, 32)},
			apiIP:   net.IPv4(10, byte(x), byte(y), 1).To4(),
			gateway: net.IPv4(10, byte(x), byte(y+1), 1).To4(),
		}
		if slices.ContainsFunc(used, func(u *net.IPNet) bool {
			return u.Contains(n.service.IP) || u.Contains(n.pods.IP) || n.service.Contains(u.IP) || n.pods.Contains(u.IP)
		}) {
			continue
		}
		if _, err := Run(context.Background(), 30*time.Second, "", nil, "ip", "link", "add", "name", n.bridge, "type", "bridge"); err != nil {
			continue // another test bed's
		}
		tb.Cleanup(func() {
			if out, err := Run(context.Background(), 30*time.Second, "", nil, "ip", "link", "del", n.bridge); err != nil {
				tb.Logf("remove bridge %s: %v\n%s", n.bridge, err, out)
			}
		})
		for _, args := range [][]string{
			{"addr", "add", n.gateway.String() + "/24", "dev", n.bridge},
			{"addr", "add", n.apiIP.String() + "/32", "dev", n.bridge},
			{"link", "set", n.bridge, "up"},
		} {
			if out, err := Run(context.Background(), 30*time.Second, "", nil, "ip", args...); err != nil {
				return nil, fmt.Errorf("%w\n%s", err, out)
			}
		}
		return n, nil
	}
	return nil, errors.New("no free 10.200-249.x.0/23 after 50 tries")
}

// routedNets are the IPv4 subnets this machine already routes or holds.
func routedNets() ([]*net.IPNet, error) {
	out, err := Run(context.Background(), 30*time.Second, "", nil, "ip", "-o", "-4", "route", "show", "table", "all")
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, out)
	}
	var nets []*net.IPNet
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		for _, f := range fields {
			if _, ipnet, err := net.ParseCIDR(f); err == nil && !ipnet.IP.Equal(net.IPv4zero) {
				nets = append(nets, ipnet)
			} else if ip := net.ParseIP(f); ip != nil && ip.To4() != nil && !ip.Equal(net.IPv4zero) {
				nets = append(nets, &net.IPNet{IP: ip.To4(), Mask: net.CIDRMask(32, 32)})
			}
		}
	}
	return nets, nil
}

// containerdConfig is containerd's configuration: everything it keeps lives
// in the node's folder. What containerd 1.6 fixes (shim sockets in
// /run/containerd/s, network namespaces in /var/run/netns, libcni's cache in
// /var/lib/cni) is the node's own too: see nodePrivatePaths.
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  # The machine lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's
  # oom_score_adj to the kubelet's -998, and every sandbox would fail.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[6]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
`

// sandboxImage is the pause image's name in the node (hack/tools.sh tags it).
const sandboxImage = "guestbackup.local/pause:1"

func (n *Node) startContainerd(tb TB, tools Tools) error {
	cniDir := filepath.Join(n.dir, "cni")
	if err := os.MkdirAll(cniDir, 0o755); err != nil {
		return err
	}
	conflist := map[string]any{
		"cniVersion": "0.4.0", "name": n.bridge,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": n.bridge, "isGateway": true, "hairpinMode": true,
			// No masquerade: pods talk to this machine only, and the
			// machine's firewall stays untouched.
			"ipMasq": false,
			"ipam": map[string]any{
				"type":   "host-local",
				"ranges": [][]map[string]string{{{"subnet": n.PodCIDR.String(), "gateway": n.Gateway.String()}}},
				// No default route: a pod (or a VM's guest behind its
				// launcher pod) reaches this machine's bridge (its pod
				// subnet, on-link) and the Service range the API server
				// is on, nothing else. With the machine forwarding, a
				// default route would carry a lookup to its resolver, or
				// anywhere, off the machine with a pod's address.
				"routes":  []map[string]string{{"dst": n.serviceCIDR.String()}},
				"dataDir": filepath.Join(n.dir, "ipam"),
			},
		}},
	}
	data, err := json.Marshal(conflist)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cniDir, "10-"+n.bridge+".conflist"), data, 0o644); err != nil {
		return err
	}
	config := filepath.Join(n.dir, "containerd.toml")
	if err := os.WriteFile(config, fmt.Appendf(nil, containerdConfig, filepath.Join(n.dir, "containerd"), filepath.Join(n.dir, "containerd-state"),
		n.socket, n.socket+".ttrpc", sandboxImage, filepath.Join(n.dir, "runc"), cniDir), 0o600); err != nil {
		return err
	}
	// The cgroups go once the node's init is gone, and with it every
	// process of the node: registered before the init starts, this cleanup
	// runs after the init's.
	if err := n.makeCgroups(); err != nil {
		return err
	}
	tb.Cleanup(n.removeCgroups)
	if err := n.startInit(tb, "/usr/bin/containerd", "--config", config); err != nil {
		return err
	}
	return WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
		if exited, err := n.initProcess.Exited(); exited {
			return false, fmt.Errorf("containerd exited: %v\n%s", err, tail(n.initProcess.LogPath, 20))
		}
		_, err := n.ctr("version")
		return err == nil, err
	})
}

// nodePrivatePaths are the machine's paths a node keeps its own copy of:
// inside the node's mount namespace each is a bind mount of a folder of the
// node's (<node folder>/root/<path>), so that two nodes on one machine (two
// suites in parallel) never share one, nothing a node writes there reaches
// the machine's real folder, and nothing is left behind when the node's
// namespaces go. Each is spelled as the program that hard-codes it spells
// it. A missing mount point is created on the host, empty, and left there
// (removing it could detach another node's bind mount on it); the host's
// contents are never touched.
var nodePrivatePaths = []string{
	// The kubelet's root (--root-dir). KubeVirt's virt-handler registers
	// its device plugins (devices.kubevirt.io/kvm, tun, vhost-net) in the
	// hard-coded /var/lib/kubelet/device-plugins, where the kubelet's
	// device manager also puts its own socket whatever --root-dir says, and
	// its DaemonSet mounts /var/lib/kubelet and /var/lib/kubelet/pods
	// (kubevirt.io/kubevirt@v1.7.0
	// pkg/virt-operator/resource/generate/components/daemonsets.go).
	"/var/lib/kubelet",
	// The kubelet's links to its containers' logs (kuberuntime's fixed
	// ContainerLogsDir); the logs themselves are in podLogsDir, the node's.
	"/var/log/containers",
	// containerd 1.6's fixed paths: its pods' network namespaces (the
	// bind mounts that keep them exist only in the node's mount
	// namespace, so they go with it), its shims' sockets, and libcni's
	// cache of the bridge plugin's results.
	"/var/run/netns", "/run/containerd", "/var/lib/cni",
	// The host paths of KubeVirt's DaemonSet (daemonsets.go above:
	// virt-handler's share, private and libvirt runtimes folders, the node
	// labeller's output, pr-helper's /etc/multipath), and two more a node
	// running KubeVirt must not write to the machine (v1.7.0's DaemonSet
	// does not mount them).
	"/var/run/kubevirt", "/var/run/kubevirt-private", "/var/run/kubevirt-libvirt-runtimes",
	"/var/lib/kubevirt-node-labeller", "/etc/multipath",
	"/var/lib/kubevirt", "/var/run/kubevirt-containerdisks",
}

// nodeInitScript runs as the node's first process after tini: it binds
// each pair of arguments (source, mount point) until "--", makes every mount
// shared within the node's namespace, as a kind node's entrypoint does
// (`mount --make-rshared /`: the kubelet and runc refuse a Bidirectional
// volume, such as virt-handler's /var/lib/kubelet and /var/run/kubevirt,
// whose source is not a shared mount), and execs the rest. Making a slave
// mount shared gives it a new peer group of the node's: what is mounted
// under it still never reaches the host.
const nodeInitScript = `set -e
while [ "$1" != -- ]; do mount --bind "$1" "$2"; shift 2; done
shift
mount --make-rshared /
exec "$@"`

// startInit starts the node's own PID and mount namespaces, with tini as
// their PID 1 and the command (containerd) as tini's child, once
// nodePrivatePaths are bound.
//
// Why namespaces of its own: virt-handler, a privileged hostPID pod, runs
// `virt-chroot --mount /proc/1/ns/mnt ...` (kubevirt.io/kubevirt@v1.7.0
// pkg/virt-handler/virt-chroot/virt-chroot.go) and reads the node's files
// through /proc/1/root; this machine's PID 1 (the VM's process_api) lets no
// one read its namespaces, and virt-handler panicked ("failed to detect the
// presence of selinux"). In the node's PID namespace PID 1 is tini, whose
// namespaces are the node's. tini reaps the orphans (shims, containers)
// as an init must, and forwards SIGTERM to containerd.
//
// Propagation: the node's mounts are slaves of the host's (unshare
// --propagation slave): what the host mounts reaches the node, what the
// node mounts (its private paths, the kubelet's volumes, containerd's
// rootfs and network namespace mounts) never reaches the host, even on a
// host whose / is shared. The node's network namespace is the host's:
// containerd and the CNI bridge plugin work on the host's bridge, and the
// test reaches pod IPs through it. The host still reaches everything the
// tests use: containerd's socket and the pods' logs are files in the node's
// folder, and ContainerPID maps a container's PID to the host's.
//
// Stopping: the init's Process is unshare's; --kill-child kills tini when
// unshare dies, and when tini exits the kernel kills every process left in
// the node's PID namespace (the kubelet, shims, containers) and, with the
// last of them, the node's mount namespace with all its mounts.
func (n *Node) startInit(tb TB, command ...string) error {
	args := []string{"--pid", "--fork", "--kill-child=SIGKILL", "--mount", "--propagation=slave", "--mount-proc",
		"--", "/usr/bin/tini", "--", "/bin/sh", "-c", nodeInitScript, "node-init"}
	for _, path := range nodePrivatePaths {
		own := filepath.Join(n.dir, "root", path)
		if err := os.MkdirAll(own, 0o755); err != nil {
			return err
		}
		// The mount point stays on the host after the node: since Linux
		// 3.18, removing it would detach what is mounted on it in every
		// other mount namespace, another package's node's included.
		if err := os.MkdirAll(path, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", path, err)
		}
		args = append(args, own, path)
	}
	args = append(append(args, "--"), command...)
	n.initProcess = StartProcess(tb, ProcessSpec{Name: "containerd", Path: "/usr/bin/unshare", Args: args})
	// unshare's one child is tini.
	unshare := n.initProcess.cmd.Process.Pid
	return WaitFor(30*time.Second, 20*time.Millisecond, func() (bool, error) {
		if exited, err := n.initProcess.Exited(); exited {
			return false, fmt.Errorf("the node's init exited: %v\n%s", err, tail(n.initProcess.LogPath, 20))
		}
		procs, err := processes()
		if err != nil {
			return false, err
		}
		for pid, p := range procs {
			if p.ppid == unshare {
				n.init = pid
				return true, nil
			}
		}
		return false, errors.New("unshare has not started tini")
	})
}

// procInfo is what /proc/PID/status tells of a process: its parent, and
// its PID in each PID namespace from this one's down to its own (NSpid).
type procInfo struct {
	ppid  int
	nspid []int
}

// processes are the machine's processes, by PID.
func processes() (map[int]procInfo, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	procs := map[int]procInfo{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // exited meanwhile
		}
		var p procInfo
		for _, line := range strings.Split(string(status), "\n") {
			key, value, _ := strings.Cut(line, ":")
			switch key {
			case "PPid":
				p.ppid, _ = strconv.Atoi(strings.TrimSpace(value))
			case "NSpid":
				for _, f := range strings.Fields(value) {
					id, _ := strconv.Atoi(f)
					p.nspid = append(p.nspid, id)
				}
			}
		}
		procs[pid] = p
	}
	return procs, nil
}

// hostPID is the host's PID of the node's process whose PID in the node's
// PID namespace is pid (what containerd reports). Another node's process
// may have the same PID in its own namespace: the one descending from this
// node's init is this node's.
func (n *Node) hostPID(pid int) (int, error) {
	procs, err := processes()
	if err != nil {
		return 0, err
	}
	level := len(procs[n.init].nspid) - 1 // the node's namespace in NSpid
	if level < 1 {
		return 0, fmt.Errorf("the node's init %d is gone", n.init)
	}
	for host, p := range procs {
		if len(p.nspid) <= level || p.nspid[level] != pid {
			continue
		}
		for a, seen := host, 0; a > 1 && seen < len(procs); a, seen = procs[a].ppid, seen+1 {
			if a == n.init {
				return host, nil
			}
		}
	}
	return 0, fmt.Errorf("no process of node %s has PID %d in its namespace", n.Name, pid)
}

// ctr runs containerd's client against the node's containerd, in the
// namespace the kubelet's pods live in.
func (n *Node) ctr(args ...string) (string, error) {
	return Run(context.Background(), 5*time.Minute, n.dir, nil, "/usr/bin/ctr", append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...)
}

// ImportImage imports an OCI image tarball into the node. An image named
// "name:tag" in the layout's index is known to the kubelet as
// "docker.io/library/name:tag", as a pod's `image: name:tag` is normalised.
func (n *Node) ImportImage(tarball string) error {
	out, err := n.ctr("images", "import", tarball)
	if err != nil {
		return fmt.Errorf("import %s: %w\n%s", tarball, err, out)
	}
	list, err := n.ctr("images", "list", "--quiet")
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(list) {
		if strings.HasPrefix(name, "sha256:") {
			continue
		}
		if full := normalizedImage(name); full != name && !slices.Contains(strings.Fields(list), full) {
			if out, err := n.ctr("images", "tag", name, full); err != nil {
				return fmt.Errorf("tag %s: %w\n%s", name, err, out)
			}
		}
	}
	return nil
}

// normalizedImage is the reference the CRI looks an image up by.
func normalizedImage(name string) string {
	first, _, found := strings.Cut(name, "/")
	switch {
	case !found:
		return "docker.io/library/" + name
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		return "docker.io/" + name
	}
	return name
}

const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
failSwapOn: false
failCgroupV1: false
address: %[2]s
port: 10250
readOnlyPort: 0
healthzPort: 0
podLogsDir: %[3]s
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
# The machine is shared: no evictions, and never collect the imported images
# (nothing could pull them back).
evictionHard:
  memory.available: "0%%"
  nodefs.available: "0%%"
  imagefs.available: "0%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
# Local volumes attach nowhere; no attach/detach controller runs.
enableControllerAttachDetach: false
`

// kubeletRoot is the kubelet's root in the node's mount namespace, a bind
// of the node's own folder (nodePrivatePaths): the path a real node's
// kubelet, and KubeVirt's hostPaths, assume.
const kubeletRoot = "/var/lib/kubelet"

// startKubelet starts the kubelet in the node's PID and mount namespaces
// (nsenter into the init's), beside containerd: what it mounts for pods
// stays in the node's mount namespace, and it dies with the node's init.
func (n *Node) startKubelet(tb TB, tools Tools, kubeconfig string) error {
	config := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, kubeletConfig, n.cgroup, n.Gateway, filepath.Join(n.dir, "pod-logs")), 0o600); err != nil {
		return err
	}
	StartProcess(tb, ProcessSpec{Name: "kubelet", Path: "/usr/bin/nsenter", Args: []string{
		"--target", strconv.Itoa(n.init), "--pid", "--mount", "--", tools.Kubelet,
		"--config=" + config, "--kubeconfig=" + kubeconfig, "--root-dir=" + kubeletRoot, "--cert-dir=" + filepath.Join(kubeletRoot, "pki"),
		"--container-runtime-endpoint=unix://" + n.socket, "--hostname-override=" + n.Name, "--node-ip=" + n.Gateway.String(), "--v=2",
	}})
	// Runs before the kubelet stops: its pods go the way they go on a
	// cluster, so their volumes are unmounted and sandboxes removed.
	tb.Cleanup(func() { n.drain(tb) })
	return nil
}

func (n *Node) waitReady() error {
	return WaitFor(3*time.Minute, 500*time.Millisecond, func() (bool, error) {
		var node corev1.Node
		if err := n.API.Client.Get(context.Background(), client.ObjectKey{Name: n.Name}, &node); err != nil {
			return false, err
		}
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady {
				return false, fmt.Errorf("node %s still tainted %s", n.Name, t.Key)
			}
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("node %s: Ready %s: %s", n.Name, c.Status, c.Message)
			}
		}
		return false, fmt.Errorf("node %s has no Ready condition", n.Name)
	})
}

// drain deletes every pod and waits (bounded) until the node runs none.
// When the test failed, it logs the tail of every container's log first:
// what `kubectl logs` would have shown.
func (n *Node) drain(tb TB) {
	ctx := context.Background()
	for _, p := range n.control {
		p.Stop()
	}
	if tb.Failed() {
		n.LogContainers(tb, 30)
	}
	var pods corev1.PodList
	if err := n.API.Client.List(ctx, &pods); err != nil {
		tb.Logf("drain: %v", err)
		return
	}
	for i := range pods.Items {
		_ = n.API.Client.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(1))
	}
	if err := WaitFor(2*time.Minute, time.Second, func() (bool, error) {
		out, err := n.ctr("tasks", "list", "--quiet")
		if err != nil {
			return false, err
		}
		return strings.TrimSpace(out) == "", fmt.Errorf("tasks still running: %s", strings.Join(strings.Fields(out), " "))
	}); err != nil {
		tb.Logf("drain node %s: %v", n.Name, err)
	}
}

// LogContainers logs the last lines of every container's log on the node,
// what `kubectl logs` shows: call it when a spec failed.
func (n *Node) LogContainers(tb TB, lines int) {
	logs, _ := filepath.Glob(filepath.Join(n.dir, "pod-logs", "*", "*", "*.log"))
	for _, l := range logs {
		rel, _ := filepath.Rel(filepath.Join(n.dir, "pod-logs"), l)
		tb.Logf("container log %s:\n%s", rel, tail(l, lines))
	}
}

// cgroupHierarchies are the mounted cgroup hierarchies the kubelet
// manages pods in: the v1 controllers' and, on a hybrid machine, the
// unified one, where it creates the root itself.
func cgroupHierarchies() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return dirs
}

// makeCgroups creates the node's own cgroup root in every hierarchy: two
// kubelets on one machine under one root would each take the other's pods
// for orphans and kill them.
func (n *Node) makeCgroups() error {
	for _, h := range cgroupHierarchies() {
		if filepath.Base(h) == "unified" {
			continue
		}
		dir := filepath.Join(h, n.cgroup)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			// A new cpuset has no CPUs or memory nodes until given its parent's.
			for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, file))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, file), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", dir, err)
				}
			}
		}
	}
	return nil
}

// removeCgroups removes the node's cgroups, children first; by then no
// process is left in them.
func (n *Node) removeCgroups() {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, n.cgroup), func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for _, d := range slices.Backward(dirs) {
			_ = os.Remove(d)
		}
	}
}

// PodIP waits until a running pod matching labels in namespace has an IP,
// and returns it.
func (n *Node) PodIP(namespace string, labels map[string]string) (string, error) {
	var ip string
	err := WaitFor(3*time.Minute, time.Second, func() (bool, error) {
		var pods corev1.PodList
		if err := n.API.Client.List(context.Background(), &pods, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
				ip = p.Status.PodIP
				return true, nil
			}
		}
		return false, fmt.Errorf("no running pod with labels %v in %s (%d pods)", labels, namespace, len(pods.Items))
	})
	return ip, err
}

// Addr is host:port of a pod IP and port, for dialing from this machine.
func Addr(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }

// ContainerPID is the host PID of a pod's running container's process
// (not the node's PID namespace's): /proc/PID/status shows the user and
// groups the kubelet gave it.
func (n *Node) ContainerPID(pod *corev1.Pod, container string) (int, error) {
	id := ""
	for _, status := range pod.Status.ContainerStatuses {
		if status.Name == container && status.State.Running != nil {
			id = strings.TrimPrefix(status.ContainerID, "containerd://")
		}
	}
	if id == "" {
		return 0, fmt.Errorf("pod %s/%s has no running container %s", pod.Namespace, pod.Name, container)
	}
	out, err := n.ctr("tasks", "list")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			// containerd's PIDs are the node's PID namespace's.
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				return 0, err
			}
			return n.hostPID(pid)
		}
	}
	return 0, fmt.Errorf("container %s of pod %s/%s has no task", container, pod.Namespace, pod.Name)
}
