package usersync

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kopia/kopia/repo/logging"
)

func TestAttemptError(t *testing.T) {
	for _, tc := range []struct {
		name, line, want string
		ok               bool
	}{
		{
			name: "a refused connection",
			line: `got error Head "http://127.0.0.1:9000/b/kopia.repository": dial tcp 127.0.0.1:9000: connect: connection refused when GetMetadata(kopia.repository) (#3), sleeping for 337.5ms before retrying`,
			want: `Head "http://127.0.0.1:9000/b/kopia.repository": dial tcp 127.0.0.1:9000: connect: connection refused`,
			ok:   true,
		},
		{
			name: "an error that says when",
			line: "got error failed when the disk was full when GetMetadata(kopia.repository) (#0), sleeping for 100ms before retrying",
			want: "failed when the disk was full",
			ok:   true,
		},
		{name: "another line of the loop's module", line: "unable to complete GetMetadata despite 10 retries"},
		{name: "the wording changed", line: "got error boom when GetMetadata(kopia.repository) (#0)"},
		{name: "no request", line: "got error boom before retrying"},
		{name: "empty", line: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := attemptError(tc.line)
			if got != tc.want || ok != tc.ok {
				t.Errorf("attemptError(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// What the loop logs reaches the witness through the context Kopia's
// requests are made with, and only the retry module's lines count.
func TestLastAttemptListensToTheRetryModule(t *testing.T) {
	w, ctx := newLastAttempt(context.Background())
	if got := w.Error(); got != "" {
		t.Fatalf("before any attempt: %q", got)
	}
	logging.Module("s3")(ctx).Debugf("got error %v when %v (#%v), sleeping for %v before retrying", errors.New("other module"), "GetBlob(x)", 0, "1s")
	logging.Module(retryModule)(ctx).Debugf("got error %v when %v (#%v), sleeping for %v before retrying", errors.New("first"), "GetMetadata(kopia.repository)", 0, "100ms")
	logging.Module(retryModule)(ctx).Debugf("got error %v when %v (#%v), sleeping for %v before retrying", errors.New("connection refused"), "GetMetadata(kopia.repository)", 1, "150ms")
	if got, want := w.Error(), "connection refused"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// A request that cannot connect is noted in net/http's words; the
// context's own ending, which every attempt cut short by the deadline
// meets, is not.
func TestLastAttemptSeesWhatARequestMet(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := listener.Addr().String()
	if err := listener.Close(); err != nil {
		t.Fatal(err)
	}
	w, ctx := newLastAttempt(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, "http://"+closed+"/bucket/kopia.repository", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("HEAD %s answered: nothing listens there", closed)
	}
	if got, want := w.Error(), "dial tcp "+closed+": connect: connection refused"; got != want {
		t.Errorf("after a refused connection: Error() = %q, want %q", got, want)
	}
	logging.Module(retryModule)(ctx).Debugf("got error %v when %v (#%v), sleeping for %v before retrying", context.DeadlineExceeded, "GetMetadata(kopia.repository)", 2, "1s")
	if got := w.Error(); !strings.Contains(got, "connection refused") {
		t.Errorf("after an attempt the deadline cut short: Error() = %q, want the refused connection kept", got)
	}
}

// A request that got a connection went further than the failures before
// it: a storage that accepts and then does not answer is not described by
// an earlier refusal.
func TestLastAttemptForgetsWhatAConnectionWentPast(t *testing.T) {
	w, ctx := newLastAttempt(context.Background())
	w.note(errors.New("dial tcp [::1]:9000: connect: network is unreachable"))
	server := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer server.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, server.URL+"/bucket/kopia.repository", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := server.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if got := w.Error(); got != "" {
		t.Errorf("after a request that connected: Error() = %q, want nothing", got)
	}
}

// The same trouble reads the same at every check: a connection's own
// address, which changes at each, is not part of it.
func TestLastAttemptLeavesOutTheLocalEndpoint(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{"read tcp 10.244.0.7:41234->10.96.0.9:9000: read: connection reset by peer", "read tcp 10.96.0.9:9000: read: connection reset by peer"},
		{"write tcp [fd00::7]:41234->[fd00::9]:443: write: broken pipe", "write tcp [fd00::9]:443: write: broken pipe"},
		{"dial tcp 127.0.0.1:9000: connect: connection refused", "dial tcp 127.0.0.1:9000: connect: connection refused"},
	} {
		w, _ := newLastAttempt(context.Background())
		w.note(errors.New(tc.err))
		if got := w.Error(); got != tc.want {
			t.Errorf("note(%q): Error() = %q, want %q", tc.err, got, tc.want)
		}
	}
}
