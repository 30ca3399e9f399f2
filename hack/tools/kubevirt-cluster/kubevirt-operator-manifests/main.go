// Command kubevirt-operator-manifests writes what a user applies to install
// KubeVirt (the release's kubevirt-operator.yaml), from the pinned release's
// own generators, for images built here rather than pulled: the kubevirt
// Namespace, the KubeVirt CRD, the kubevirt-cluster-critical PriorityClass,
// virt-operator's RBAC and its Deployment. virt-operator then installs
// everything else (virt-api, virt-controller, virt-handler) from its install
// strategy, deriving their images from its own name, as on any cluster.
//
//	go run ./kubevirt-operator-manifests -registry guestbackup.local/kubevirt -tag v1.7.0 > kubevirt-operator.yaml
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
	"sigs.k8s.io/yaml"
)

func main() {
	namespace := flag.String("namespace", "kubevirt", "The namespace KubeVirt is installed in.")
	registry := flag.String("registry", "guestbackup.local/kubevirt", "Where the images are named from: <registry>/virt-operator:<tag>.")
	tag := flag.String("tag", "", "The images' tag: the KubeVirt release.")
	pullPolicy := flag.String("pull-policy", string(corev1.PullNever), "virt-operator's imagePullPolicy.")
	operatorReplicas := flag.Int("replicas", 1, "virt-operator's replicas.")
	flag.Parse()
	if *tag == "" {
		fmt.Fprintln(os.Stderr, "kubevirt-operator-manifests: -tag is required")
		os.Exit(2)
	}
	if err := write(os.Stdout, *namespace, *registry, *tag, corev1.PullPolicy(*pullPolicy), int32(*operatorReplicas)); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirt-operator-manifests:", err)
		os.Exit(1)
	}
}

func write(w io.Writer, namespace, registry, tag string, pullPolicy corev1.PullPolicy, replicas int32) error {
	crd, err := components.NewKubeVirtCrd()
	if err != nil {
		return fmt.Errorf("KubeVirt CRD: %w", err)
	}
	objects := []any{
		// As the release's manifest: KubeVirt's pods are privileged.
		&corev1.Namespace{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{
				"kubevirt.io": "", "pod-security.kubernetes.io/enforce": "privileged",
			}},
		},
		crd,
		components.NewKubeVirtPriorityClassCR(),
		// The release's template writes this one role by hand: the operator
		// manages KubeVirt CRs, and admins may too.
		&rbacv1.ClusterRole{
			TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: "kubevirt.io:operator", Labels: map[string]string{
				"operator.kubevirt.io": "", "rbac.authorization.k8s.io/aggregate-to-admin": "true",
			}},
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{"kubevirt.io"}, Resources: []string{"kubevirts"},
				Verbs: []string{"get", "delete", "create", "update", "patch", "list", "watch", "deletecollection"},
			}},
		},
	}
	objects = append(objects, rbac.GetAllOperator(namespace)...)
	operator := components.NewOperatorDeployment(namespace, registry, "", tag, "2", "", "",
		"", "", "", "", "", "", "", "", "", "", "", pullPolicy)
	// One replica by default: the test bed's cluster has one node, and a
	// second operator there would only wait for the first's lease.
	operator.Spec.Replicas = ptr.To[int32](replicas)
	objects = append(objects, operator)
	for _, o := range objects {
		data, err := manifest(o)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "---\n%s", data); err != nil {
			return err
		}
	}
	return nil
}

// manifest is o as YAML without the fields a manifest leaves to the server.
func manifest(o any) ([]byte, error) {
	data, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	var u unstructured.Unstructured
	if err := json.Unmarshal(data, &u.Object); err != nil {
		return nil, err
	}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	return yaml.Marshal(u.Object)
}
