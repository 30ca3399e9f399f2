package usersync

import (
	"context"
	"crypto/tls"
	"net/http/httptrace"
	"regexp"
	"strings"
	"sync"

	"github.com/kopia/kopia/repo/logging"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// retryModule is the logging module of Kopia's retry loop
// (internal/retry), which every blob request of a repository goes
// through.
const retryModule = "retry"

// lastAttempt keeps the last error that an attempt to reach the storage
// met. Kopia's retry loop, and for S3 minio-go's below it, retry passing
// trouble (a refused connection, a timeout, an I/O error) until their
// context ends and then return only the context's error. The storage's
// own words are in what they logged and in what net/http's trace saw:
// the loop's lines, and the failed name lookups, connections and TLS
// handshakes of the requests made with the context.
type lastAttempt struct {
	zapcore.LevelEnabler
	mu   sync.Mutex
	last string
}

// newLastAttempt returns a lastAttempt and ctx with it listening to
// Kopia's retry loop, beside whatever ctx logs to already, and to the
// HTTP requests made with it.
func newLastAttempt(ctx context.Context) (*lastAttempt, context.Context) {
	w := &lastAttempt{LevelEnabler: zapcore.DebugLevel}
	nop := zap.NewNop().Sugar()
	ctx = logging.WithAdditionalLogger(ctx, func(module string) logging.Logger {
		if module != retryModule {
			return nop
		}
		return zap.New(w).Sugar()
	})
	return w, httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		DNSDone:          func(i httptrace.DNSDoneInfo) { w.note(i.Err) },
		ConnectDone:      func(_, _ string, err error) { w.note(err) },
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) { w.note(err) },
		// A request that got a connection went further than any failure
		// before it (another of the name's addresses refused, an earlier
		// attempt): what stopped it is not theirs to say.
		GotConn: func(httptrace.GotConnInfo) { w.forget() },
	})
}

// Error returns the last error noted, "" when none was.
func (w *lastAttempt) Error() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// note keeps err unless it is nil or the context's own ending, which
// says nothing of the storage.
func (w *lastAttempt) note(err error) {
	if err != nil {
		w.noteText(err.Error())
	}
}

func (w *lastAttempt) noteText(text string) {
	if text == "" || strings.HasSuffix(text, context.DeadlineExceeded.Error()) || strings.HasSuffix(text, context.Canceled.Error()) {
		return
	}
	// The same trouble reads the same at every check, so that it is
	// published once: a connection's own port changes at each.
	text = localEndpoint.ReplaceAllString(text, "")
	w.mu.Lock()
	w.last = text
	w.mu.Unlock()
}

// localEndpoint is the local address in Go's errors of an open connection
// ("read tcp 10.244.0.7:41234->10.96.0.9:9000: ... reset by peer").
var localEndpoint = regexp.MustCompile(`\S+:\d+->`)

// forget drops what was noted.
func (w *lastAttempt) forget() {
	w.mu.Lock()
	w.last = ""
	w.mu.Unlock()
}

// With implements zapcore.Core; the loop's fields carry nothing it keeps.
func (w *lastAttempt) With([]zapcore.Field) zapcore.Core { return w }

// Check implements zapcore.Core.
func (w *lastAttempt) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if w.Enabled(e.Level) {
		return ce.AddCore(e, w)
	}
	return ce
}

// Write implements zapcore.Core.
func (w *lastAttempt) Write(e zapcore.Entry, _ []zapcore.Field) error {
	if text, ok := attemptError(e.Message); ok {
		w.noteText(text)
	}
	return nil
}

// Sync implements zapcore.Core.
func (*lastAttempt) Sync() error { return nil }

// attemptError returns the error of one of the retry loop's lines, which
// read "got error <error> when <request> (#<n>), sleeping for <d> before
// retrying" (Kopia v0.23). Another line is not one: a change of that
// wording costs the storage's words, never a wrong message.
func attemptError(line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "got error ")
	if !ok || !strings.HasSuffix(rest, " before retrying") {
		return "", false
	}
	// The request ("GetMetadata(kopia.repository)") names no " when ";
	// the error might.
	i := strings.LastIndex(rest, " when ")
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}
