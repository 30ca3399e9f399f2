package kubevirt

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	gtypes "github.com/onsi/gomega/types"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/test/story"
)

// The API server of these specs runs KubeVirt's control plane and no
// guestbackup: virt-api admits every VM as on a cluster (it adds its
// defaults), and what the webhook would have written is written as is.
var _ = Describe("The VirtualMachine CRD of the test bed", Ordered, func() {
	var (
		ctx       context.Context
		apiServer *testbed.APIServer
	)
	BeforeAll(func() {
		ctx = context.Background()
		apiServer = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
		testbed.StartKubeVirt(GinkgoT(), apiServer)
	})

	It("stores an opted-in VM with containerDisk, cloudInitNoCloud secretRef and interfaces, every field as written", func() {
		vm := story.TypicalVM("typical")
		want := vm.Spec.DeepCopy()
		Expect(apiServer.Client.Create(ctx, vm)).To(Succeed())

		got := &kubevirtv1.VirtualMachine{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKeyFromObject(vm), got)).To(Succeed())
		Expect(got.Spec).To(keepEverything(*want))
		Expect(got.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationServer, "backup/default"))
	})

	It("stores a disk-mode VM, a secret volume on a disk with a serial, every field as written", func() {
		vm := story.TypicalVM("disk-mode")
		spec := &vm.Spec.Template.Spec
		// The VM keeps its own cloud-init; the bootstrap arrives on a second disk.
		spec.Volumes[1].CloudInitNoCloud = &kubevirtv1.CloudInitNoCloudSource{UserData: "#cloud-config\nhostname: disk-mode\n"}
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: "guestbackup", VolumeSource: kubevirtv1.VolumeSource{
			Secret: &kubevirtv1.SecretVolumeSource{SecretName: "disk-mode-guestbackup", VolumeLabel: "GUESTBACKUP"},
		}})
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{
			Name: "guestbackup", Serial: "guestbackup", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}},
		})
		want := vm.Spec.DeepCopy()
		Expect(apiServer.Client.Create(ctx, vm)).To(Succeed())

		got := &kubevirtv1.VirtualMachine{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKeyFromObject(vm), got)).To(Succeed())
		Expect(got.Spec).To(keepEverything(*want))
	})

	It("is served with virt-operator's short names, category, status subresource and columns", func() {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		Expect(apiServer.Client.Get(ctx, client.ObjectKey{Name: "virtualmachines.kubevirt.io"}, crd)).To(Succeed())
		Expect(crd.Spec.Names.ShortNames).To(Equal([]string{"vm", "vms"}))
		Expect(crd.Spec.Names.Categories).To(Equal([]string{"all"}))
		Expect(crd.Spec.Versions).To(ContainElement(SatisfyAll(
			HaveField("Name", "v1"),
			HaveField("Subresources.Status", Not(BeNil())),
			HaveField("AdditionalPrinterColumns", HaveLen(3)),
		)))
	})
})

// keepEverything matches what the API server stored of a VM whose spec
// was want: every field of want with its value, list items in their
// order, and nothing else than what virt-api's mutator adds (its defaults
// are its business; dropping or changing a field of ours is the CRD's or
// KubeVirt's fault).
func keepEverything(want kubevirtv1.VirtualMachineSpec) gtypes.GomegaMatcher {
	return WithTransform(func(got kubevirtv1.VirtualMachineSpec) ([]string, error) {
		var w, g any
		for _, v := range []struct {
			from kubevirtv1.VirtualMachineSpec
			to   *any
		}{{want, &w}, {got, &g}} {
			data, err := json.Marshal(v.from)
			if err != nil {
				return nil, err
			}
			if err := json.Unmarshal(data, v.to); err != nil {
				return nil, err
			}
		}
		return lost("spec", w, g), nil
	}, BeEmpty())
}

// lost lists the paths below path where got lacks or changed what want
// has.
func lost(path string, want, got any) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v, want an object", path, got)}
		}
		var out []string
		for k, v := range w {
			out = append(out, lost(path+"."+k, v, g[k])...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: %v, want %d items", path, got, len(w))}
		}
		var out []string
		for i := range w {
			out = append(out, lost(fmt.Sprintf("%s[%d]", path, i), w[i], g[i])...)
		}
		return out
	}
	if !reflect.DeepEqual(want, got) {
		return []string{fmt.Sprintf("%s: %v, want %v", path, got, want)}
	}
	return nil
}
