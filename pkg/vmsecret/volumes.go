package vmsecret

import (
	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// SecretsRead names every Secret volume v reads, by any field: a secret
// disk; the user-data and the network data of a cloudInitNoCloud or a
// cloudInitConfigDrive volume; a sysprep volume's Secret. A VM reads a
// credential Secret whatever the field: while any volume names it, its
// content (the owner's user-data merged there among it) is in use.
func SecretsRead(v kubevirtv1.VolumeSource) []string {
	var names []string
	ref := func(r *corev1.LocalObjectReference) {
		if r != nil {
			names = append(names, r.Name)
		}
	}
	switch {
	case v.Secret != nil:
		names = append(names, v.Secret.SecretName)
	case v.CloudInitNoCloud != nil:
		ref(v.CloudInitNoCloud.UserDataSecretRef)
		ref(v.CloudInitNoCloud.NetworkDataSecretRef)
	case v.CloudInitConfigDrive != nil:
		ref(v.CloudInitConfigDrive.UserDataSecretRef)
		ref(v.CloudInitConfigDrive.NetworkDataSecretRef)
	case v.Sysprep != nil:
		ref(v.Sysprep.Secret)
	}
	return names
}
