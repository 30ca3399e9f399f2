package local

import (
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

// KubeVirt's instance-id is the VM's firmware UUID: the one its spec sets,
// else the one virt-controller derives from its name alone, so every boot
// of a VM, and no other VM, has it.
func TestInstanceIDIsKubeVirtsFirmwareUUID(t *testing.T) {
	vm := func(name, firmware string) *kubevirtv1.VirtualMachine {
		v := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}}}
		v.Name = name
		if firmware != "" {
			v.Spec.Template.Spec.Domain.Firmware = &kubevirtv1.Firmware{UUID: "0b9c1a6e-9d51-4c11-a3f2-3a1f5b2c7d10"}
		}
		return v
	}
	if got := InstanceID(vm("web", "set")); got != "0b9c1a6e-9d51-4c11-a3f2-3a1f5b2c7d10" {
		t.Errorf("with a firmware UUID: %q", got)
	}
	legacy := InstanceID(vm("web", ""))
	if legacy != InstanceID(vm("web", "")) || legacy == InstanceID(vm("db", "")) {
		t.Errorf("the legacy UUID is not a function of the name: %q", legacy)
	}
	// A UUIDv5: version nibble 5, RFC 4122 variant.
	if len(legacy) != 36 || legacy[14] != '5' || (legacy[19] != '8' && legacy[19] != '9' && legacy[19] != 'a' && legacy[19] != 'b') {
		t.Errorf("the legacy UUID %q is not a UUIDv5", legacy)
	}
}
