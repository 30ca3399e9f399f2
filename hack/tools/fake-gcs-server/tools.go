//go:build tools

// Package tools pins fake-gcs-server, the test bed's Google Cloud Storage
// emulator (internal/testbed.StartFakeGCS).
package tools

import _ "github.com/fsouza/fake-gcs-server"
