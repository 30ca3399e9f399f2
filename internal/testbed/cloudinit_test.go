package testbed

import (
	"errors"
	"strings"
	"testing"
)

// TestCloudInitValidatorChecks proves the validator judges: it accepts a
// valid document and rejects a known-bad one with cloud-init's message.
// (Without python3-jsonschema, cloud-init calls every document valid.)
func TestCloudInitValidatorChecks(t *testing.T) {
	good := []byte("#cloud-config\nwrite_files:\n  - path: /etc/guestbackup/url\n    content: https://example.invalid:51515\n    permissions: '0600'\nruncmd:\n  - [systemctl, start, guestbackup-connect.service]\n")
	if err := ValidateCloudConfig(t, good); err != nil {
		t.Fatalf("valid document rejected: %v", err)
	}

	bad := []byte("#cloud-config\nwrite_files:\n  - path: 42\n    permissions: [not, a, mode]\nruncmd: yes\n")
	err := ValidateCloudConfig(t, bad)
	var cerr *CloudInitError
	if !errors.As(err, &cerr) {
		t.Fatalf("known-bad document accepted (error %v): the validator does not check", err)
	}
	for _, want := range []string{"runcmd", "write_files"} {
		if !strings.Contains(cerr.Output, want) {
			t.Errorf("rejection does not mention %s:\n%s", want, cerr.Output)
		}
	}
}
