package testbed

import (
	"context"
	"os"
	"path/filepath"
	"time"
)

// ValidateCloudConfig runs Debian's `cloud-init schema` on a cloud-config
// document and returns its verdict: nil when valid, else an error carrying
// cloud-init's own messages.
func ValidateCloudConfig(tb TB, cloudConfig []byte) error {
	tb.Helper()
	tools := MustTools(tb)
	dir := tb.TempDir()
	file := filepath.Join(dir, "user-data")
	if err := os.WriteFile(file, cloudConfig, 0o600); err != nil {
		tb.Fatalf("%v", err)
	}
	out, err := Run(context.Background(), time.Minute, dir, nil, tools.CloudInitSchema, "--config-file", file)
	if err != nil {
		return &CloudInitError{Output: out, Err: err}
	}
	return nil
}

// CloudInitError is cloud-init's rejection of a document.
type CloudInitError struct {
	Output string
	Err    error
}

func (e *CloudInitError) Error() string {
	return "cloud-init schema: " + e.Err.Error() + "\n" + e.Output
}

func (e *CloudInitError) Unwrap() error { return e.Err }
