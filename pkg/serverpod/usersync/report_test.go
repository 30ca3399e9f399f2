package usersync

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/tools/record"
)

// TestRetentionFailuresReachTheAdmin: a failed run of server-time retention
// is counted every time and is a Warning Event on the BSLS once per new
// failure, so that an admin sees snapshots are no longer expiring without
// an Event every interval.
func TestRetentionFailuresReachTheAdmin(t *testing.T) {
	events := record.NewFakeRecorder(10)
	s := New(Options{BSLS: "main", Namespace: "backup", Events: events, Log: logr.Discard(), RetentionInterval: 10 * time.Minute})
	before := testutil.ToFloat64(RetentionFailures)
	locked := errors.New("open repository: blob storage unavailable")

	for _, err := range []error{locked, locked, locked, nil, locked, errors.New("another failure")} {
		s.reportRetention(err)
	}

	if got := testutil.ToFloat64(RetentionFailures) - before; got != 5 {
		t.Errorf("counter rose by %v, want 5 (one per failed run)", got)
	}
	close(events.Events)
	var got []string
	for e := range events.Events {
		got = append(got, e)
	}
	want := []string{
		"Warning RetentionFailed Retention on the server's clock failed, so no snapshot is expired until it runs again (every 10m0s): open repository: blob storage unavailable",
		"Warning RetentionFailed Retention on the server's clock failed, so no snapshot is expired until it runs again (every 10m0s): open repository: blob storage unavailable",
		"Warning RetentionFailed Retention on the server's clock failed, so no snapshot is expired until it runs again (every 10m0s): another failure",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Events:\n%s\nwant (a repeated failure once, again after a success):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
