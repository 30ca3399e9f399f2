package mutate

import (
	"errors"
	"fmt"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"
)

// admitted is what admission reads of a VirtualMachine object: its name,
// namespace, UID, deletion and annotations and, of its template, the
// annotations, the volumes that can carry cloud-init or a Secret, and the
// disks' names. Nothing else is decoded: a fully populated VM is mostly
// fields guestbackup never reads, and decoding them whole (KubeVirt's
// types, its own decoders) was most of an admission's time.
//
// Every container on the paths the patch writes to is a pointer or a
// slice, so that a member the object lacks (absent, or null) tells from one
// it has: a patch adds what is missing from the first such member on.
type admitted struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		UID               types.UID         `json:"uid"`
		DeletionTimestamp *metav1.Time      `json:"deletionTimestamp"`
		Annotations       map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec *struct {
		Template *struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec *struct {
				Volumes []admittedVolume `json:"volumes"`
				Domain  *struct {
					Devices *struct {
						Disks []struct {
							Name string `json:"name"`
						} `json:"disks"`
					} `json:"devices"`
				} `json:"domain"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// admittedVolume is what admission reads of a volume: its name and the
// sources it acts on (cloud-init, Secrets) or refuses (sysprep).
type admittedVolume struct {
	Name                 string                                 `json:"name"`
	CloudInitNoCloud     *kubevirtv1.CloudInitNoCloudSource     `json:"cloudInitNoCloud"`
	CloudInitConfigDrive *kubevirtv1.CloudInitConfigDriveSource `json:"cloudInitConfigDrive"`
	Secret               *kubevirtv1.SecretVolumeSource         `json:"secret"`
	Sysprep              *kubevirtv1.SysprepSource              `json:"sysprep"`
}

// shape is which containers on the paths of the template's volumes and
// disks the admitted object has (present, and not null).
type shape struct {
	templateSpec, volumes, domain, devices, disks bool
}

// admittedVM is an admitted VirtualMachine object as readAdmitted read it.
type admittedVM struct {
	// vm is the VM as far as admission reads it (admitted): a volume
	// holds only the sources admission reads, a disk only its name.
	vm *kubevirtv1.VirtualMachine
	// shape is which containers of the template's paths the object has.
	shape shape
	// twice are the fields given twice along them.
	twice []error
}

// readAdmitted reads an admitted VirtualMachine object as the API server's
// JSON patch sees it, so that the patch's paths hold by construction: field
// names case-sensitively (a JSON patch matches them exactly; KubeVirt's
// own decoders would forgive "Volumes"), and with the decoder's types (a
// list is a list, an object an object, or the object is refused). Fields
// given twice are recorded: a JSON patch (the last one wins) and a decoder
// (merging them) read them differently, so a patch through them is refused
// (Decide).
func readAdmitted(object []byte) (*admittedVM, error) {
	var a admitted
	twice, err := sigsjson.UnmarshalStrict(object, &a, sigsjson.DisallowDuplicateFields)
	if err != nil {
		return nil, err
	}
	m := a.Metadata
	r := &admittedVM{twice: twice, vm: &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, DeletionTimestamp: m.DeletionTimestamp, Annotations: m.Annotations,
	}}}
	if a.Spec == nil || a.Spec.Template == nil {
		return r, nil
	}
	t := a.Spec.Template
	r.vm.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: t.Metadata.Annotations}}
	if t.Spec == nil {
		return r, nil
	}
	spec := &r.vm.Spec.Template.Spec
	r.shape.templateSpec, r.shape.volumes = true, t.Spec.Volumes != nil
	for _, v := range t.Spec.Volumes {
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: v.Name, VolumeSource: kubevirtv1.VolumeSource{
			CloudInitNoCloud: v.CloudInitNoCloud, CloudInitConfigDrive: v.CloudInitConfigDrive, Secret: v.Secret, Sysprep: v.Sysprep,
		}})
	}
	if t.Spec.Domain != nil {
		r.shape.domain = true
		if d := t.Spec.Domain.Devices; d != nil {
			r.shape.devices, r.shape.disks = true, d.Disks != nil
			for _, disk := range d.Disks {
				spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: disk.Name})
			}
		}
	}
	return r, nil
}

// Paths of the template's lists the webhook appends to.
var (
	volumesPath = []string{"spec", "template", "spec", "volumes"}
	disksPath   = []string{"spec", "template", "spec", "domain", "devices", "disks"}
)

// appendVolumeAndDisk are the operations that append vol to the
// template's volumes and disk to its disks, in an object of shape s that
// has a template: each list is appended to where the object has it, else
// added, with any object above it the object lacks. The volumes come
// first: once they are added, the template has a spec.
func appendVolumeAndDisk(s shape, vol, disk any) []jsonpatch.JsonPatchOperation {
	volumes := 2 + count(s.templateSpec, s.volumes)
	disks := 3 + count(s.domain, s.devices, s.disks)
	return []jsonpatch.JsonPatchOperation{appendItem(volumesPath, volumes, vol), appendItem(disksPath, disks, disk)}
}

// count is how many of the leading conditions hold, up to the first that
// does not: how many segments of a path exist when each needs the one
// before.
func count(present ...bool) int {
	n := 0
	for _, p := range present {
		if !p {
			break
		}
		n++
	}
	return n
}

// appendItem appends item to the list at path, of which the object has the
// first present segments (all of them: the list itself), or adds the list,
// and the objects above it, at the first segment it lacks.
func appendItem(path []string, present int, item any) jsonpatch.JsonPatchOperation {
	if present >= len(path) {
		return jsonpatch.NewOperation("add", "/"+strings.Join(path, "/")+"/-", item)
	}
	var value any = []any{item}
	for i := len(path) - 1; i > present; i-- {
		value = map[string]any{path[i]: value}
	}
	return jsonpatch.NewOperation("add", "/"+strings.Join(path[:present+1], "/"), value)
}

// twiceRefusal is why a patch is not sent for an object that gives fields
// twice, "" when it gives none.
func twiceRefusal(twice []error) string {
	if len(twice) == 0 {
		return ""
	}
	return fmt.Sprintf("guestbackup cannot patch this VirtualMachine: %v; give each field once", errors.Join(twice...))
}
