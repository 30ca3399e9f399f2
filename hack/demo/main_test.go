package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDemoNarratesUpToAReadyServer runs the demo without its guest (the
// end-to-end suite boots one on the same path, internal/local): every step
// up to a Ready server is narrated, and everything it started is stopped.
func TestDemoNarratesUpToAReadyServer(t *testing.T) {
	var out bytes.Buffer
	r := newRun(&out, testing.Verbose())
	err := r.guard(func() error { return demo(context.Background(), r, false) })
	if cerr := r.close(); cerr != nil {
		t.Errorf("stopping: %v", cerr)
	}
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"==> 1. Starting a real API server",
		"==> 2. Admin: creating BackupStorageLocationServer backup/main",
		"Ready: endpoint https://10.0.2.2:",
		"the demo stops here, with the server ready",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the narration lacks %q:\n%s", want, out.String())
		}
	}
	if r.Failed() {
		t.Errorf("the run was marked failed:\n%s", out.String())
	}
}
