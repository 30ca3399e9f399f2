package testbed

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// SmallVM is a VirtualMachine namespace/name with annotations, the least an
// owner writes: 1 GiB, a containerDisk as its root disk, no cloud-init of its
// own, halted (no node need run it). Specs that only create VMs (admission,
// credentials, identity) use it.
func SmallVM(namespace, name string, annotations map[string]string) *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: annotations},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
						Devices: kubevirtv1.Devices{Disks: []kubevirtv1.Disk{
							{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
						}},
					},
					Volumes: []kubevirtv1.Volume{
						{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/debian:12"}}},
					},
				},
			},
		},
	}
}

// CredentialSecret is the credential Secret of VM namespace/vm as
// guestbackup's webhook writes it for the BSLS server ("<namespace>/<name>",
// the VM's annotation): the per-VM Secret contract's name, labels and keys
// (api/v1alpha1, pkg/vmsecret), stamped as issued now, with the password of
// generation and a cloud-config payload.
func CredentialSecret(namespace, vm, server, password, generation string) *corev1.Secret {
	serverNamespace, serverName, _ := strings.Cut(server, "/")
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: v1alpha1.CredentialSecretName(vm), Namespace: namespace,
			Annotations: map[string]string{v1alpha1.AnnotationIssuedAt: time.Now().UTC().Format(time.RFC3339Nano)},
			Labels: map[string]string{
				v1alpha1.LabelManagedBy:       v1alpha1.ManagedByValue,
				v1alpha1.LabelVM:              vm,
				v1alpha1.LabelServerNamespace: serverNamespace,
				v1alpha1.LabelServerName:      serverName,
			},
		},
		Data: map[string][]byte{
			v1alpha1.SecretKeyUsername:   []byte(vm + "@" + namespace),
			v1alpha1.SecretKeyPassword:   []byte(password),
			v1alpha1.SecretKeyGeneration: []byte(generation),
			v1alpha1.SecretKeyUserData:   []byte("#cloud-config\n"),
		},
	}
}
