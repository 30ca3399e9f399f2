package story

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// TypicalVM is an opted-in VM the way the webhook leaves it: a containerDisk,
// a NoCloud volume reading its user-data from a Secret, and a pod network.
func TypicalVM(name string) *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default",
			Annotations: map[string]string{v1alpha1.AnnotationServer: "backup/default"},
		},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io/vm": name}},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
						Devices: kubevirtv1.Devices{
							Disks: []kubevirtv1.Disk{
								{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
								{Name: "cloudinit", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
							},
							Interfaces: []kubevirtv1.Interface{{
								Name:                   "default",
								InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
							}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
					Volumes: []kubevirtv1.Volume{
						{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/debian:12"}}},
						{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{
							UserDataSecretRef: &corev1.LocalObjectReference{Name: name + "-guestbackup"},
						}}},
					},
				},
			},
		},
	}
}

// OwnersVM is VM namespace/name as its owner writes it: the containerDisk,
// their own inline cloud-config userData, and the opt-in to the BSLS
// server ("<namespace>/<name>") with paths.
func OwnersVM(namespace, name, server, paths, userData string) *kubevirtv1.VirtualMachine {
	vm := TypicalVM(name)
	vm.Namespace = namespace
	vm.Annotations = map[string]string{v1alpha1.AnnotationServer: server, v1alpha1.AnnotationPaths: paths}
	vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud = &kubevirtv1.CloudInitNoCloudSource{UserData: userData}
	return vm
}

// CreateStored creates vm and returns it as the API server stored it:
// injected by guestbackup's webhook, defaulted by KubeVirt's.
func CreateStored(ctx context.Context, c client.Client, vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	GinkgoHelper()
	Expect(c.Create(ctx, vm)).To(Succeed())
	stored := &kubevirtv1.VirtualMachine{}
	Expect(c.Get(ctx, client.ObjectKeyFromObject(vm), stored)).To(Succeed())
	return stored
}
