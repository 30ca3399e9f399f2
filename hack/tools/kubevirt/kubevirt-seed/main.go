// Command kubevirt-seed builds a VirtualMachineInstance's cloud-init seed and
// secret disks with KubeVirt's own code, as virt-launcher does in its
// preStartHook (pkg/virt-launcher/virtwrap/manager.go), outside
// virt-launcher: the test bed's node runs it for every instance it boots.
//
//		kubevirt-seed -vmi FILE -secrets DIR -out DIR
//
//	  - -vmi FILE: the instance, as JSON (as virt-controller created it);
//	  - -secrets DIR: the pod's Secret volumes as the kubelet mounts them at
//	    KubeVirt's config.SecretSourceDir: DIR/<volume>/userdata for a
//	    cloudInitNoCloud secretRef, DIR/<volume>/<key> for a secret volume;
//	  - -out DIR: where the ISOs go.
//
// It prints, as JSON, the NoCloud or ConfigDrive ISO ("seed", empty when the
// instance has no cloud-init) and each secret disk's ISO by volume name
// ("disks"). KubeVirt's pkg/cloud-init (ReadCloudInitVolumeDataSource,
// SetLocalDirectory, GenerateLocalData) and pkg/config (SecretSourceDir,
// SecretDisksDir, CreateSecretDisks) do the work, with xorrisofs as in
// virt-launcher; only the folders differ, and the files keep the test bed's
// owner (virt-launcher hands them to its qemu user).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	v1 "kubevirt.io/api/core/v1"

	cloudinit "kubevirt.io/kubevirt/pkg/cloud-init"
	"kubevirt.io/kubevirt/pkg/config"
	ephemeraldiskutils "kubevirt.io/kubevirt/pkg/ephemeral-disk-utils"
)

// result is what kubevirt-seed prints.
type result struct {
	Seed  string            `json:"seed,omitempty"`
	Disks map[string]string `json:"disks,omitempty"`
}

func main() {
	vmiFile := flag.String("vmi", "", "the VirtualMachineInstance, as JSON")
	secrets := flag.String("secrets", "", "the pod's Secret volumes, as mounted at SecretSourceDir")
	out := flag.String("out", "", "folder for the ISOs")
	flag.Parse()
	if *vmiFile == "" || *secrets == "" || *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: kubevirt-seed -vmi FILE -secrets DIR -out DIR")
		os.Exit(2)
	}
	res, err := run(*vmiFile, *secrets, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubevirt-seed: %v\n", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintf(os.Stderr, "kubevirt-seed: %v\n", err)
		os.Exit(1)
	}
}

func run(vmiFile, secrets, out string) (*result, error) {
	data, err := os.ReadFile(vmiFile)
	if err != nil {
		return nil, err
	}
	vmi := &v1.VirtualMachineInstance{}
	if err := json.Unmarshal(data, vmi); err != nil {
		return nil, fmt.Errorf("%s: %w", vmiFile, err)
	}
	// The test bed has no qemu user to hand the files to.
	ephemeraldiskutils.MockDefaultOwnershipManager()
	config.SecretSourceDir = secrets
	config.SecretDisksDir = filepath.Join(out, "secret-disks")
	if err := os.MkdirAll(config.SecretDisksDir, 0o750); err != nil {
		return nil, err
	}
	if err := cloudinit.SetLocalDirectory(filepath.Join(out, "cloud-init")); err != nil {
		return nil, err
	}

	res := &result{Disks: map[string]string{}}
	// virt-launcher's preStartHook, then generateCloudInitISO.
	ci, err := cloudinit.ReadCloudInitVolumeDataSource(vmi, config.SecretSourceDir)
	if err != nil {
		return nil, fmt.Errorf("read cloud-init data: %w", err)
	}
	if ci != nil {
		if err := cloudinit.PrepareLocalPath(vmi.Name, vmi.Namespace); err != nil {
			return nil, err
		}
		if err := cloudinit.GenerateLocalData(vmi, instanceType(vmi), ci); err != nil {
			return nil, fmt.Errorf("generate cloud-init seed: %w", err)
		}
		res.Seed = cloudinit.GetIsoFilePath(ci.DataSource, vmi.Name, vmi.Namespace)
	}
	if err := config.CreateSecretDisks(vmi, false); err != nil {
		return nil, fmt.Errorf("create secret disks: %w", err)
	}
	for _, v := range vmi.Spec.Volumes {
		if v.Secret != nil {
			res.Disks[v.Name] = config.GetSecretDiskPath(v.Name)
		}
	}
	return res, nil
}

// instanceType is the instance type virt-launcher gives GenerateLocalData:
// the cluster-wide one's name, else the namespaced one's.
func instanceType(vmi *v1.VirtualMachineInstance) string {
	if t := vmi.Annotations[v1.ClusterInstancetypeAnnotation]; t != "" {
		return t
	}
	return vmi.Annotations[v1.InstancetypeAnnotation]
}
