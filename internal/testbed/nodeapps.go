package testbed

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// BuildImage builds guestbackup's image as `make image` does
// (hack/image.sh), named tag ("name:tag"), into the test's folder, and
// returns the OCI tarball's path for NodeOptions.Images.
func BuildImage(tb TB, tag string) string {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	image := filepath.Join(tb.TempDir(), "guestbackup-image.tar")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// The developer's own environment: a build, with Go's and the tools'
	// caches where they are.
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "image.sh"), image)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IMAGE_TAG="+tag)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("hack/image.sh: %v\n%s", err, out)
	}
	return image
}

// Kubeconfig writes a kubeconfig file for the cluster's admin (for helm
// or kubectl) and returns its path.
func (n *Node) Kubeconfig(tb TB) string {
	tb.Helper()
	return n.API.Kubeconfig(tb)
}

// Helm runs the test bed's helm against the cluster, with its own home
// and kubeconfig, and returns its standard output; a failure carries its
// standard error.
func (n *Node) Helm(tb TB, args ...string) (string, error) {
	tb.Helper()
	if n.helmHome == "" {
		n.helmHome = tb.TempDir()
		n.kubeconfig = n.Kubeconfig(tb)
	}
	helm := MustTools(tb).Helm
	mustBeGranted(helm)
	cmd := exec.Command(helm, append(args, "--kubeconfig", n.kubeconfig)...)
	cmd.Env = append(baseEnv(n.helmHome),
		"HELM_CACHE_HOME="+filepath.Join(n.helmHome, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(n.helmHome, "config"),
		"HELM_DATA_HOME="+filepath.Join(n.helmHome, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// LocalVolume creates a local PersistentVolume of size, of class
// storageClass (created without a provisioner when missing), on the node,
// on a fresh folder of the node's that is root-owned and 0755 as a
// provisioner hands out a new claim's root directory. The kubelet applies a pod's fsGroup to it.
// It returns the folder.
func (n *Node) LocalVolume(tb TB, name, storageClass, size string) string {
	tb.Helper()
	ctx := context.Background()
	// In the node's folder, not the caller's: a spec's temporary folder
	// goes when the spec ends, while the volume lives as long as the node.
	dir := filepath.Join(n.dir, "volumes", name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		tb.Fatalf("%v", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatalf("%v", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		tb.Fatalf("%v", err)
	}
	err := n.API.Client.Create(ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: storageClass},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatalf("create StorageClass %s: %v", storageClass, err)
	}
	if err := n.API.Client.Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              storageClass,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{n.Name}}},
			}}}},
		},
	}); err != nil {
		tb.Fatalf("create PersistentVolume %s: %v", name, err)
	}
	return dir
}

// ChartInstall names what InstallChart installs: guestbackup's image as
// `make image` builds it, tagged Repository:Tag, and the chart's release
// Release in Namespace.
type ChartInstall struct {
	Repository, Tag    string
	Release, Namespace string
	// Values are more `--set` values, as an admin tunes an install.
	Values []string
	// KubeVirt, when set, installs KubeVirt from these images on the node
	// before the chart (InstallKubeVirt), as an admin installs KubeVirt
	// before what extends it; the node then allows privileged pods.
	KubeVirt *KubeVirtImages
}

// InstallChart is guestbackup installed the way an admin installs it, on a
// fresh cluster with one real node: it builds the image (BuildImage),
// starts the cluster with the image imported (StartNode) and without
// guestbackup's CRDs (the chart's templates own them: helm refuses a CRD
// it did not create), runs cert-manager's controllers and cainjector (as
// the chart expects cert-manager installed), and `helm install`s
// charts/guestbackup with only the image values changed (pullPolicy Never:
// the node pulls nothing). It returns once helm did; the pods may not be
// Ready yet.
func InstallChart(tb TB, o ChartInstall) *Node {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	image := BuildImage(tb, o.Repository+":"+o.Tag)
	node := StartNode(tb, NodeOptions{Images: []string{image},
		APIServer:       APIServerOptions{WithoutGuestbackupCRDs: true, WithoutKubeVirtCRDs: o.KubeVirt != nil},
		AllowPrivileged: o.KubeVirt != nil})
	StartCertManager(tb, node.API, CertManagerOptions{})
	StartCAInjector(tb, node.API)
	if o.KubeVirt != nil {
		if err := InstallKubeVirt(tb, node, *o.KubeVirt); err != nil {
			tb.Fatalf("%v", err)
		}
	}
	args := []string{"install", o.Release, filepath.Join(root, "charts", "guestbackup"), "--namespace", o.Namespace, "--create-namespace",
		"--set", "image.repository=" + o.Repository, "--set", "image.tag=" + o.Tag, "--set", "image.pullPolicy=Never"}
	for _, v := range o.Values {
		args = append(args, "--set", v)
	}
	if _, err := node.Helm(tb, args...); err != nil {
		tb.Fatalf("%v", err)
	}
	return node
}
