package testbed

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// PodOptions describe a pod to run on this machine.
type PodOptions struct {
	// Namespace and Spec are the pod's; Spec is typically a Deployment's
	// template, exactly as a controller wrote it.
	Namespace string
	Spec      corev1.PodSpec
	// Binaries maps an image's command path (e.g. /usr/local/bin/kopia),
	// or a file of the image an argument names, to the local binary that
	// stands for it.
	Binaries map[string]string
	// Claims maps a PersistentVolumeClaim's name to the folder that holds its
	// data; the same folder in two runs is the same volume.
	Claims map[string]string
	// API is the API server the pod's Secrets, ConfigMaps and service
	// account live in.
	API *APIServer
	// Ports fixes the loopback port of some container ports (a Service's
	// node port, in effect); the others get free ones.
	Ports map[int32]int
	// Name is the pod's name (metadata.name in the downward API); default
	// "pod".
	Name string
}

// Pod is a pod's containers running as local processes on loopback. The
// harness realises what the kubelet would: env from Secrets, ConfigMaps and
// the downward API; Secret, ConfigMap, emptyDir and claim volumes as folders
// (mount paths in commands and env are rewritten to them); container ports as
// free loopback ports, and so the ports a container listens on on the pod's
// own loopback (a pod's loopback is its own; this host's is shared); the
// service account as a kubeconfig whose identity is the service account, so
// its RBAC is enforced by the real API server.
type Pod struct {
	// Ports maps each container port to the loopback port it listens on.
	Ports      map[int32]int
	Containers map[string]*Process

	spec corev1.PodSpec
}

// RunPod runs the init containers to completion, then starts the containers.
// The test's cleanup stops them.
//
// It imitates the kubelet, kindly: volume files are its own user's, the
// containers run as this process's user, and fsGroup, Secret modes, image
// users and probes are not enforced. Where a spec is about how a pod runs,
// use the real node (StartNode) instead; test/node shows the server pod
// there. RunPod remains for the suites that start a server per spec in
// seconds on a fixed loopback port a qemu guest reaches (internal/local,
// pkg/kopiaserver's envtest suites).
func RunPod(tb TB, o PodOptions) *Pod {
	tb.Helper()
	r := &podRunner{o: o, tb: tb, dir: tb.TempDir(), mounts: map[string]string{}}
	pod, err := r.run()
	if err != nil {
		tb.Fatalf("run pod: %v", err)
	}
	return pod
}

type podRunner struct {
	o      PodOptions
	tb     TB
	dir    string
	ports  map[int32]int
	mounts map[string]string // volume name -> host folder
	env    []string          // KUBECONFIG for the service account
}

func (r *podRunner) run() (*Pod, error) {
	if err := r.allocatePorts(); err != nil {
		return nil, err
	}
	if err := r.materializeVolumes(); err != nil {
		return nil, err
	}
	if err := r.serviceAccount(); err != nil {
		return nil, err
	}
	for _, c := range r.o.Spec.InitContainers {
		path, args, env, err := r.container(c)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(r.workdir(c.Name), 0o700); err != nil {
			return nil, err
		}
		out, err := Run(context.Background(), 2*time.Minute, r.workdir(c.Name), env, path, args...)
		if err != nil {
			return nil, fmt.Errorf("init container %s: %w\n%s", c.Name, err, out)
		}
	}
	pod := &Pod{Ports: r.ports, Containers: map[string]*Process{}, spec: r.o.Spec}
	for _, c := range r.o.Spec.Containers {
		path, args, env, err := r.container(c)
		if err != nil {
			return nil, err
		}
		pod.Containers[c.Name] = StartProcess(r.tb, ProcessSpec{Name: "container-" + c.Name, Path: path, Args: args, Env: env, Dir: r.workdir(c.Name)})
	}
	return pod, nil
}

func (r *podRunner) workdir(name string) string {
	return filepath.Join(r.dir, "containers", name)
}

// loopbackListen is an argument by which a container listens on the pod's
// loopback alone, e.g. --address=127.0.0.1:51517: that port is the pod's,
// as its container ports are, though no container port declares it (the
// network cannot reach it). Other loopback addresses in arguments are
// services of this host (MinIO, an emulator), which every pod reaches.
var loopbackListen = regexp.MustCompile(`^--[a-z-]*(address|addr|listen)=(127\.0\.0\.1|localhost):([0-9]+)$`)

func (r *podRunner) allocatePorts() error {
	r.ports = map[int32]int{}
	allocate := func(port int32) error {
		if _, done := r.ports[port]; done {
			return nil
		}
		if fixed, ok := r.o.Ports[port]; ok {
			r.ports[port] = fixed
			return nil
		}
		local, err := FreePort()
		if err != nil {
			return err
		}
		r.ports[port] = local
		return nil
	}
	for _, c := range slices.Concat(r.o.Spec.InitContainers, r.o.Spec.Containers) {
		for _, p := range c.Ports {
			if err := allocate(p.ContainerPort); err != nil {
				return err
			}
		}
		for _, a := range slices.Concat(c.Command, c.Args) {
			m := loopbackListen.FindStringSubmatch(a)
			if m == nil {
				continue
			}
			port, err := strconv.ParseInt(m[3], 10, 32)
			if err != nil {
				return fmt.Errorf("container %s: %s: %w", c.Name, a, err)
			}
			if err := allocate(int32(port)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *podRunner) materializeVolumes() error {
	ctx := context.Background()
	for _, v := range r.o.Spec.Volumes {
		dir := filepath.Join(r.dir, "volumes", v.Name)
		switch {
		case v.EmptyDir != nil:
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
		case v.Secret != nil:
			s := &corev1.Secret{}
			if err := r.o.API.Client.Get(ctx, client.ObjectKey{Namespace: r.o.Namespace, Name: v.Secret.SecretName}, s); err != nil {
				return fmt.Errorf("volume %s: Secret %s: %w", v.Name, v.Secret.SecretName, err)
			}
			if err := writeVolume(dir, s.Data, v.Secret.Items); err != nil {
				return fmt.Errorf("volume %s: %w", v.Name, err)
			}
		case v.ConfigMap != nil:
			cm := &corev1.ConfigMap{}
			if err := r.o.API.Client.Get(ctx, client.ObjectKey{Namespace: r.o.Namespace, Name: v.ConfigMap.Name}, cm); err != nil {
				return fmt.Errorf("volume %s: ConfigMap %s: %w", v.Name, v.ConfigMap.Name, err)
			}
			data := map[string][]byte{}
			for k, val := range cm.Data {
				data[k] = []byte(val)
			}
			if err := writeVolume(dir, data, v.ConfigMap.Items); err != nil {
				return fmt.Errorf("volume %s: %w", v.Name, err)
			}
		case v.PersistentVolumeClaim != nil:
			claimDir, ok := r.o.Claims[v.PersistentVolumeClaim.ClaimName]
			if !ok {
				return fmt.Errorf("volume %s: no folder stands for claim %s", v.Name, v.PersistentVolumeClaim.ClaimName)
			}
			dir = claimDir
		default:
			return fmt.Errorf("volume %s: this harness runs emptyDir, secret, configMap and persistentVolumeClaim volumes only", v.Name)
		}
		r.mounts[v.Name] = dir
	}
	return nil
}

func writeVolume(dir string, data map[string][]byte, items []corev1.KeyToPath) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if len(items) == 0 {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		value, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("no key %s", it.Key)
		}
		if err := os.WriteFile(filepath.Join(dir, it.Path), value, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// serviceAccount gives the containers a kubeconfig that authenticates as
// the pod's service account, as in-cluster configuration would.
func (r *podRunner) serviceAccount() error {
	sa := r.o.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	user, err := r.o.API.Env.AddUser(envtest.User{
		Name:   "system:serviceaccount:" + r.o.Namespace + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + r.o.Namespace, "system:authenticated"},
	}, nil)
	if err != nil {
		return fmt.Errorf("service account %s: %w", sa, err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	if _, err := clientcmd.Load(kubeconfig); err != nil {
		return fmt.Errorf("service account kubeconfig: %w", err)
	}
	path := filepath.Join(r.dir, "serviceaccount.kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return err
	}
	r.env = []string{"KUBECONFIG=" + path}
	return nil
}

// container resolves a container's binary, arguments and environment.
func (r *podRunner) container(c corev1.Container) (string, []string, []string, error) {
	if len(c.Command) == 0 {
		return "", nil, nil, fmt.Errorf("container %s has no command; this harness does not know image entrypoints", c.Name)
	}
	path, ok := r.o.Binaries[c.Command[0]]
	if !ok {
		return "", nil, nil, fmt.Errorf("container %s: no local binary stands for %s", c.Name, c.Command[0])
	}
	rewrite, err := r.rewriter(c)
	if err != nil {
		return "", nil, nil, err
	}
	vars := map[string]string{}
	var env []string
	for _, e := range c.Env {
		value, err := r.envValue(e, vars)
		if err != nil {
			return "", nil, nil, fmt.Errorf("container %s: env %s: %w", c.Name, e.Name, err)
		}
		if value == nil {
			continue // an optional reference to a missing key
		}
		vars[e.Name] = rewrite(*value)
		env = append(env, e.Name+"="+vars[e.Name])
	}
	var args []string
	for _, a := range slices.Concat(c.Command[1:], c.Args) {
		args = append(args, rewrite(expand(a, vars)))
	}
	return path, args, append(env, r.env...), nil
}

// rewriter maps a container's mount paths to their folders and its ports
// to loopback ports.
func (r *podRunner) rewriter(c corev1.Container) (func(string) string, error) {
	type sub struct {
		re   *regexp.Regexp
		with string
	}
	var subs []sub
	mounts := slices.Clone(c.VolumeMounts)
	// Longest first, so /config/tls wins over /config.
	slices.SortFunc(mounts, func(a, b corev1.VolumeMount) int { return len(b.MountPath) - len(a.MountPath) })
	for _, m := range mounts {
		if m.SubPath != "" {
			return nil, fmt.Errorf("container %s: subPath mounts are not supported", c.Name)
		}
		dir, ok := r.mounts[m.Name]
		if !ok {
			return nil, fmt.Errorf("container %s mounts unknown volume %s", c.Name, m.Name)
		}
		re := regexp.MustCompile(`(^|[=\s:,])` + regexp.QuoteMeta(m.MountPath) + `(/|$|[\s,])`)
		subs = append(subs, sub{re, "${1}" + dir + "${2}"})
	}
	// Files of the image that arguments name (a binary the process
	// serves, not runs) are the local binaries that stand for them.
	for image, local := range r.o.Binaries {
		re := regexp.MustCompile(`(^|[=\s:,])` + regexp.QuoteMeta(image) + `($|[\s,])`)
		subs = append(subs, sub{re, "${1}" + local + "${2}"})
	}
	for port, local := range r.ports {
		re := regexp.MustCompile(`\b(0\.0\.0\.0|127\.0\.0\.1|localhost):` + strconv.Itoa(int(port)) + `\b`)
		subs = append(subs, sub{re, "127.0.0.1:" + strconv.Itoa(local)})
		// A bare ":port" (every interface, e.g. --metrics-bind-address=:8080)
		// listens on loopback here.
		bare := regexp.MustCompile(`(^|=):` + strconv.Itoa(int(port)) + `\b`)
		subs = append(subs, sub{bare, "${1}127.0.0.1:" + strconv.Itoa(local)})
	}
	return func(s string) string {
		for _, sb := range subs {
			s = sb.re.ReplaceAllString(s, sb.with)
		}
		return s
	}, nil
}

func (r *podRunner) envValue(e corev1.EnvVar, vars map[string]string) (*string, error) {
	ctx := context.Background()
	if e.ValueFrom == nil {
		v := expand(e.Value, vars)
		return &v, nil
	}
	switch src := e.ValueFrom; {
	case src.SecretKeyRef != nil:
		s := &corev1.Secret{}
		err := r.o.API.Client.Get(ctx, client.ObjectKey{Namespace: r.o.Namespace, Name: src.SecretKeyRef.Name}, s)
		v, ok := s.Data[src.SecretKeyRef.Key]
		if err != nil || !ok {
			if src.SecretKeyRef.Optional != nil && *src.SecretKeyRef.Optional {
				return nil, nil
			}
			return nil, fmt.Errorf("Secret %s key %s: %v", src.SecretKeyRef.Name, src.SecretKeyRef.Key, err)
		}
		value := string(v)
		return &value, nil
	case src.ConfigMapKeyRef != nil:
		cm := &corev1.ConfigMap{}
		err := r.o.API.Client.Get(ctx, client.ObjectKey{Namespace: r.o.Namespace, Name: src.ConfigMapKeyRef.Name}, cm)
		v, ok := cm.Data[src.ConfigMapKeyRef.Key]
		if err != nil || !ok {
			if src.ConfigMapKeyRef.Optional != nil && *src.ConfigMapKeyRef.Optional {
				return nil, nil
			}
			return nil, fmt.Errorf("ConfigMap %s key %s: %v", src.ConfigMapKeyRef.Name, src.ConfigMapKeyRef.Key, err)
		}
		return &v, nil
	case src.FieldRef != nil && src.FieldRef.FieldPath == "metadata.namespace":
		return &r.o.Namespace, nil
	case src.FieldRef != nil && src.FieldRef.FieldPath == "metadata.name":
		name := r.o.Name
		if name == "" {
			name = "pod"
		}
		return &name, nil
	default:
		return nil, fmt.Errorf("this harness resolves value, secretKeyRef, configMapKeyRef, metadata.namespace and metadata.name only")
	}
}

// WaitReady polls the readiness probes (tcpSocket or httpGet) of the named
// containers, or of all when none is named, until all pass or timeout
// passes; a container that exits fails it.
func (p *Pod) WaitReady(timeout time.Duration, containers ...string) error {
	return WaitFor(timeout, 100*time.Millisecond, func() (bool, error) {
		for _, c := range p.spec.Containers {
			if exited, err := p.Containers[c.Name].Exited(); exited {
				return false, fmt.Errorf("container %s exited (%v):\n%s", c.Name, err, tail(p.Containers[c.Name].LogPath, 30))
			}
			if c.ReadinessProbe == nil || (len(containers) > 0 && !slices.Contains(containers, c.Name)) {
				continue
			}
			if err := p.probe(c, c.ReadinessProbe.ProbeHandler); err != nil {
				return false, fmt.Errorf("container %s not ready: %w", c.Name, err)
			}
		}
		return true, nil
	})
}

// Addr is the loopback address a container port listens on.
func (p *Pod) Addr(containerPort int32) string {
	return "127.0.0.1:" + strconv.Itoa(p.Ports[containerPort])
}

func (p *Pod) probe(c corev1.Container, h corev1.ProbeHandler) error {
	port := func(ip intstr.IntOrString) (int32, error) {
		if ip.Type == intstr.Int {
			return ip.IntVal, nil
		}
		for _, cp := range c.Ports {
			if cp.Name == ip.StrVal {
				return cp.ContainerPort, nil
			}
		}
		return 0, fmt.Errorf("no port named %s", ip.StrVal)
	}
	switch {
	case h.TCPSocket != nil:
		n, err := port(h.TCPSocket.Port)
		if err != nil {
			return err
		}
		conn, err := net.DialTimeout("tcp", p.Addr(n), time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	case h.HTTPGet != nil:
		n, err := port(h.HTTPGet.Port)
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + p.Addr(n) + h.HTTPGet.Path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			return fmt.Errorf("GET %s: %s: %s", h.HTTPGet.Path, resp.Status, strings.TrimSpace(string(body[:n])))
		}
		return nil
	default:
		return fmt.Errorf("this harness probes tcpSocket and httpGet only")
	}
}
