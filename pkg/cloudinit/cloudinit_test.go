package cloudinit

import (
	"bytes"
	"strings"
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
	BootCmd    []any      `json:"bootcmd"`
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
bootcmd:
  - [touch, /var/tmp/user-boot-marker]
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
	if len(got.RunCmd) != 1 || got.RunCmd[0][1] != "/var/tmp/user-marker" {
		t.Errorf("the VM's runcmd changed: %v", got.RunCmd)
	}
	if len(got.WriteFiles) != 1 || got.WriteFiles[0].Path != "/etc/motd" {
		t.Errorf("the VM's write_files changed: %v", got.WriteFiles)
	}
	// Ours runs at every boot, after the VM's own.
	if len(got.BootCmd) != 2 {
		t.Fatalf("want the VM's bootcmd then ours, got %v", got.BootCmd)
	}
	script, _ := got.BootCmd[1].(string)
	if first, _ := got.BootCmd[0].([]any); len(first) != 2 || first[1] != "/var/tmp/user-boot-marker" ||
		!strings.Contains(script, "put "+ConfDir+"/password 0600 -n") || !strings.Contains(script, "systemctl restart --no-block "+ConnectUnit) {
		t.Errorf("want the VM's bootcmd first and ours appended, got %v", got.BootCmd)
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
