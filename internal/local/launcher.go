package local

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// seedTimeout bounds kubevirt-seed (two xorrisofs runs).
const seedTimeout = time.Minute

// mountSecrets writes vmi's Secrets into dir as the kubelet mounts them into
// the virt-launcher pod virt-controller renders (KubeVirt v1.8.1,
// pkg/virt-controller/services/rendervolumes.go), dir standing for
// KubeVirt's config.SecretSourceDir: a cloud-init volume's secretRef as the
// subPath files <volume>/userdata and <volume>/userData (networkData
// likewise), of the keys the Secret has; a secret volume whole, a file per
// key under <volume>. A Secret that is missing fails, as the kubelet fails
// to set up the pod, unless the volume says it is optional.
func mountSecrets(ctx context.Context, c client.Client, vmi *kubevirtv1.VirtualMachineInstance, dir string) error {
	get := func(name string, optional bool) (map[string][]byte, error) {
		s := &corev1.Secret{}
		err := c.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: name}, s)
		if apierrors.IsNotFound(err) && optional {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("mount Secret %s/%s for VirtualMachineInstance %s: %w", vmi.Namespace, name, vmi.Name, err)
		}
		return s.Data, nil
	}
	write := func(volume string, files map[string][]byte) error {
		folder := filepath.Join(dir, volume)
		if err := os.MkdirAll(folder, 0o700); err != nil {
			return err
		}
		for name, data := range files {
			if name != filepath.Base(name) || name == "." || name == ".." {
				return fmt.Errorf("Secret key %q of volume %s is no file name", name, volume)
			}
			if err := os.WriteFile(filepath.Join(folder, name), data, 0o600); err != nil {
				return err
			}
		}
		return nil
	}
	// subPaths are the files of a cloud-init volume's Secrets: the keys
	// KubeVirt mounts, of those the Secret has.
	subPaths := func(userData, networkData *corev1.LocalObjectReference) (map[string][]byte, error) {
		files := map[string][]byte{}
		for ref, keys := range map[*corev1.LocalObjectReference][]string{userData: {"userdata", "userData"}, networkData: {"networkdata", "networkData"}} {
			if ref == nil {
				continue
			}
			data, err := get(ref.Name, false)
			if err != nil {
				return nil, err
			}
			for _, k := range keys {
				if v, ok := data[k]; ok {
					files[k] = v
				}
			}
		}
		return files, nil
	}
	for _, v := range vmi.Spec.Volumes {
		var files map[string][]byte
		var err error
		switch {
		case v.CloudInitNoCloud != nil:
			files, err = subPaths(v.CloudInitNoCloud.UserDataSecretRef, v.CloudInitNoCloud.NetworkDataSecretRef)
		case v.CloudInitConfigDrive != nil:
			files, err = subPaths(v.CloudInitConfigDrive.UserDataSecretRef, v.CloudInitConfigDrive.NetworkDataSecretRef)
		case v.Secret != nil:
			files, err = get(v.Secret.SecretName, v.Secret.Optional != nil && *v.Secret.Optional)
		default:
			continue
		}
		if err != nil {
			return err
		}
		if err := write(v.Name, files); err != nil {
			return err
		}
	}
	return nil
}

// seedResult is what kubevirt-seed prints: the cloud-init seed's image and
// each secret disk's, by volume.
type seedResult struct {
	Seed  string            `json:"seed"`
	Disks map[string]string `json:"disks"`
}

// kubevirtSeed runs kubevirt-seed (tool) for vmi, whose Secrets are mounted
// at secrets, writing its images under out.
func kubevirtSeed(ctx context.Context, tool string, vmi *kubevirtv1.VirtualMachineInstance, secrets, out string) (*seedResult, error) {
	data, err := json.Marshal(vmi)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return nil, err
	}
	vmiFile := filepath.Join(out, "vmi.json")
	if err := os.WriteFile(vmiFile, data, 0o600); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, seedTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, "-vmi", vmiFile, "-secrets", secrets, "-out", out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("KubeVirt's cloud-init and config code: %w: %s", err, stderr.String())
	}
	res := &seedResult{}
	if err := json.Unmarshal(stdout, res); err != nil {
		return nil, fmt.Errorf("kubevirt-seed's answer %q: %w", stdout, err)
	}
	return res, nil
}
