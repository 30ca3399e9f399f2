package cloudinit

import (
	"bytes"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// These tests hand what guestbackup renders to Debian's real cloud-init:
// its schema validator, and its own user-data processing and merging.

func TestRenderedCloudConfigPassesCloudInitSchema(t *testing.T) {
	withPaths := testBootstrap(t)
	withPaths.Paths = []string{"/etc", "/home/alice/my notes"}
	for name, b := range map[string]Bootstrap{"connect-only": testBootstrap(t), "with-paths": withPaths} {
		cc, err := CloudConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := testbed.ValidateCloudConfig(t, cc); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// merged is the cloud-config cloud-init runs, decoded.
type merged struct {
	Hostname   string     `json:"hostname"`
	Packages   []string   `json:"packages"`
	RunCmd     [][]string `json:"runcmd"`
	WriteFiles []struct {
		Path        string `json:"path"`
		Content     string `json:"content"`
		Permissions string `json:"permissions"`
	} `json:"write_files"`
}

func TestCloudInitRunsTheVMsOwnConfigAndOurs(t *testing.T) {
	user := []byte(`#cloud-config
hostname: web-01
packages: [htop]
write_files:
  - path: /etc/motd
    content: "owned by the VM owner\n"
runcmd:
  - [touch, /var/tmp/user-marker]
`)
	ours, err := CloudConfig(testBootstrap(t))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := Merge(user, ours)
	if err != nil {
		t.Fatal(err)
	}
	cc, others, err := testbed.CloudInitProcess(t, payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != 0 {
		t.Errorf("cloud-init found %d parts besides cloud-config", len(others))
	}
	if err := testbed.ValidateCloudConfig(t, cc); err != nil {
		t.Errorf("the cloud-config cloud-init merged is invalid: %v", err)
	}
	var got merged
	if err := yaml.Unmarshal(cc, &got); err != nil {
		t.Fatal(err)
	}
	if got.Hostname != "web-01" || len(got.Packages) != 1 {
		t.Errorf("the VM's own keys were lost: hostname %q, packages %v", got.Hostname, got.Packages)
	}
	if len(got.RunCmd) < 2 || got.RunCmd[0][1] != "/var/tmp/user-marker" || got.RunCmd[len(got.RunCmd)-1][3] != ConnectUnit {
		t.Errorf("want the VM's runcmd first and ours appended, got %v", got.RunCmd)
	}
	paths := map[string]string{}
	for _, f := range got.WriteFiles {
		paths[f.Path] = f.Permissions
	}
	if _, ok := paths["/etc/motd"]; !ok {
		t.Errorf("the VM's own file is gone: %v", paths)
	}
	if paths[ConfDir+"/password"] != "0600" || paths[ConnectScript] != "0755" {
		t.Errorf("our files are missing or have the wrong modes: %v", paths)
	}
}

func TestCloudInitRunsTheVMsOwnScriptUntouched(t *testing.T) {
	script := []byte("#!/bin/bash\necho 'the owner\\'s script' > /var/tmp/user-script\n")
	ours, err := CloudConfig(testBootstrap(t))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := Merge(script, ours)
	if err != nil {
		t.Fatal(err)
	}
	cc, others, err := testbed.CloudInitProcess(t, payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != 1 || others[0].ContentType != "text/x-shellscript" || !bytes.Equal(others[0].Payload, script) {
		t.Errorf("cloud-init does not run the VM's script as it was: %+v", others)
	}
	if err := testbed.ValidateCloudConfig(t, cc); err != nil {
		t.Error(err)
	}
}
