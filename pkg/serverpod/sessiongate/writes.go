package sessiongate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/go-logr/logr"
	"github.com/kopia/kopia/repo"
	"google.golang.org/protobuf/encoding/protowire"
)

// WriteGuard says whose sessions may not write now (usersync.Syncer: a VM
// over its backup quota).
type WriteGuard interface {
	// RefusesWrites returns why user (user@host) may not write to the
	// repository now, nil when it may. It is called for each request of a
	// session, so it must be cheap (a map lookup).
	RefusesWrites(user string) error
}

// Kopia's session protocol (internal/grpcapi/repository_server.proto of
// Kopia v0.23.1): the fields of a SessionRequest and a SessionResponse the
// gate reads or writes.
const (
	// SessionRequest.request_id, and SessionResponse.request_id.
	fieldRequestID protowire.Number = 1
	// SessionRequest's oneof request spans these fields.
	fieldFirstRequest protowire.Number = 10
	fieldLastRequest  protowire.Number = 21
	// The requests that add to the repository: WriteContentRequest and
	// PutManifestRequest. The others read, flush what the session wrote
	// (nothing new once its writes are refused), or free space.
	fieldWriteContent protowire.Number = 13
	fieldPutManifest  protowire.Number = 16
	// SessionResponse.error, an ErrorResponse of a code and a message.
	fieldError        protowire.Number = 2
	fieldErrorCode    protowire.Number = 1
	fieldErrorMessage protowire.Number = 2
	// ErrorResponse.ACCESS_DENIED: Kopia's client makes it an error of the
	// message alone (errorFromSessionResponse).
	codeAccessDenied = 5
)

// prefixLen is the length of a gRPC message's prefix: a flag byte (1: the
// message is compressed) and its length, big-endian.
const prefixLen = 5

// maxMessage bounds a message the gate holds whole: the largest Kopia's
// server and client accept (the gRPC limits they set).
const maxMessage = repo.MaxGRPCMessageSize

// frames follows the message boundaries of a gRPC stream (each message
// its 5-byte prefix, then as many bytes as it says) as its bytes go by,
// holding none but the prefix.
type frames struct {
	prefix [prefixLen]byte
	// have is how many bytes of the current message's prefix went by: 0
	// between two messages.
	have int
	// left is how many bytes of the current message are still to come,
	// once its prefix is complete.
	left uint32
}

// atBoundary is whether the stream is between two messages.
func (f *frames) atBoundary() bool { return f.have == 0 }

// next follows p, the stream's next bytes, up to the end of the current
// message, and returns how many of p it took: all of them, or fewer when a
// message ends inside p (then the stream is at a boundary).
func (f *frames) next(p []byte) int {
	i := 0
	for i < len(p) {
		if f.have < prefixLen {
			n := copy(f.prefix[f.have:], p[i:])
			f.have += n
			i += n
			if f.have < prefixLen {
				return i
			}
			f.left = binary.BigEndian.Uint32(f.prefix[1:])
		}
		skip := min(uint64(f.left), uint64(len(p)-i))
		i += int(skip)
		f.left -= uint32(skip)
		if f.left == 0 {
			f.have = 0
			return i
		}
	}
	return i
}

// follow follows all of p.
func (f *frames) follow(p []byte) {
	for len(p) > 0 {
		p = p[f.next(p):]
	}
}

// inspectRequest reads a SessionRequest, as a hostile client may encode
// it: fields in any order, any of them repeated, the last one winning, as
// Kopia's server reads it. It returns the request's ID and whether it
// writes (its last field of the oneof is write_content or put_manifest).
// What Kopia's client never sends and the gate cannot read the same way
// as the server (a request ID or a request of another wire type) is an
// error.
func inspectRequest(msg []byte) (requestID int64, writes bool, err error) {
	var request protowire.Number
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return 0, false, fmt.Errorf("a field's tag: %w", protowire.ParseError(n))
		}
		msg = msg[n:]
		switch {
		case num == fieldRequestID:
			if typ != protowire.VarintType {
				return 0, false, fmt.Errorf("request_id of wire type %d", typ)
			}
			var v uint64
			v, n = protowire.ConsumeVarint(msg)
			requestID = int64(v)
		case num >= fieldFirstRequest && num <= fieldLastRequest:
			if typ != protowire.BytesType {
				return 0, false, fmt.Errorf("request field %d of wire type %d", num, typ)
			}
			_, n = protowire.ConsumeBytes(msg)
			request = num
		default:
			n = protowire.ConsumeFieldValue(num, typ, msg)
		}
		if n < 0 {
			return 0, false, fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		msg = msg[n:]
	}
	return requestID, request == fieldWriteContent || request == fieldPutManifest, nil
}

// refusal is the gRPC message of a SessionResponse to request requestID
// that is an ErrorResponse ACCESS_DENIED saying message.
func refusal(requestID int64, message string) []byte {
	var e []byte
	e = protowire.AppendTag(e, fieldErrorCode, protowire.VarintType)
	e = protowire.AppendVarint(e, codeAccessDenied)
	e = protowire.AppendTag(e, fieldErrorMessage, protowire.BytesType)
	e = protowire.AppendString(e, message)
	m := make([]byte, prefixLen, prefixLen+len(e)+24)
	m = protowire.AppendTag(m, fieldRequestID, protowire.VarintType)
	m = protowire.AppendVarint(m, uint64(requestID))
	m = protowire.AppendTag(m, fieldError, protowire.BytesType)
	m = protowire.AppendBytes(m, e)
	binary.BigEndian.PutUint32(m[1:prefixLen], uint32(len(m)-prefixLen))
	return m
}

// refusedWrite is the message the guest's kopia fails with when the gate
// refuses one of its writes.
func refusedWrite(why error) string { return "guestbackup: " + why.Error() }

// sessionRefusal is the cause of a session the gate ended for a message of
// a user refused writes that it would not pass on; the guest is answered
// with its gRPC status.
type sessionRefusal struct {
	code    int
	message string
}

func (e *sessionRefusal) Error() string { return e.message }

// guardedBody is the request body of a session whose writes a WriteGuard
// may refuse. At each message's start it asks the guard: a message of a
// user it does not refuse goes by as it is read, only its prefix looked
// at; one of a user it refuses is read whole and inspected, and a write is
// answered by the gate (answers) and never reaches Kopia. A message it
// cannot inspect ends the session (end), with a gRPC status.
type guardedBody struct {
	body    io.ReadCloser
	user    string
	guard   WriteGuard
	answers *answerWriter
	end     func(cause error)
	log     logr.Logger

	// f follows the messages passed on as they were read.
	f frames
	// held are bytes read from body, from a message's start, that are yet
	// to be inspected or passed on; bodyErr is body's error read with them.
	held    []byte
	bodyErr error
	// out is what is left to pass on of a message inspected whole.
	out []byte
	// err ends the body.
	err error
}

// Read passes on the session's messages: see guardedBody. The guard is
// asked when a message's first bytes are in, not before they are awaited:
// its answer may change while the guest is idle.
func (b *guardedBody) Read(p []byte) (int, error) {
	for {
		if b.err != nil {
			return 0, b.err
		}
		if len(b.out) > 0 {
			n := copy(p, b.out)
			b.out = b.out[n:]
			return n, nil
		}
		fromHeld := len(b.held) > 0
		n, err := b.source(p)
		off := 0
		var why error
		for off < n {
			if b.f.atBoundary() {
				if why = b.guard.RefusesWrites(b.user); why != nil {
					break
				}
			}
			off += b.f.next(p[off:n])
		}
		switch {
		case why == nil && fromHeld:
			b.held = b.held[n:]
		case why != nil && fromHeld:
			b.held = b.held[off:]
		case why != nil:
			b.held, b.bodyErr = append([]byte(nil), p[off:n]...), err
			err = nil
		}
		if why != nil && off == 0 {
			// The message starts here: it is read whole.
			b.err = b.inspect(why)
			continue
		}
		if n > 0 || err != nil {
			// Up to the next message, when it is of a user now refused.
			return off, err
		}
	}
}

// source reads what was held back first, then body.
func (b *guardedBody) source(p []byte) (int, error) {
	if len(b.held) > 0 {
		return copy(p, b.held), nil
	}
	if b.bodyErr != nil {
		return 0, b.bodyErr
	}
	return b.body.Read(p)
}

// sourceReader reads a guardedBody's source, consuming what it returns.
type sourceReader struct{ b *guardedBody }

func (r sourceReader) Read(p []byte) (int, error) {
	n, err := r.b.source(p)
	if len(r.b.held) > 0 {
		r.b.held = r.b.held[n:]
	}
	return n, err
}

// inspect reads the next message whole, for a user refused writes for
// why, and either answers it (a write), passes it on (b.out), or ends the
// session. It returns the error that ends the body, nil while it goes on.
func (b *guardedBody) inspect(why error) error {
	src := sourceReader{b}
	var prefix [prefixLen]byte
	if _, err := io.ReadFull(src, prefix[:]); err != nil {
		return err // io.EOF: the guest ended its stream between messages
	}
	length := binary.BigEndian.Uint32(prefix[1:])
	switch {
	case prefix[0] != 0:
		// Kopia's client never compresses (it sets no compressor).
		return b.refuse(grpcInvalidArgument, fmt.Sprintf("%s: a compressed message (flag %d), which the gate does not read", refusedWrite(why), prefix[0]))
	case length > maxMessage:
		return b.refuse(grpcResourceExhausted, fmt.Sprintf("%s: a message of %d bytes, above the %d Kopia takes", refusedWrite(why), length, maxMessage))
	}
	if length > maxInspected {
		return b.inspectLarge(src, why, length)
	}
	msg, err := readMessage(src, prefix, length)
	if err != nil {
		return err
	}
	id, writes, err := inspectRequest(msg[prefixLen:])
	if err != nil {
		return b.refuse(grpcInvalidArgument, fmt.Sprintf("%s: a message the gate cannot read: %v", refusedWrite(why), err))
	}
	if !writes {
		b.out = msg
		return nil
	}
	b.log.V(1).Info("write refused", "user", b.user, "why", why.Error())
	b.answers.answer(refusal(id, refusedWrite(why)))
	return nil
}

// maxInspected bounds what the gate holds of a message of a user refused
// writes: the requests that read are a few hundred bytes, so only a write
// (new content, a manifest) is larger, and a session holds no more than
// this however many streams its guest opens.
const maxInspected = 64 << 10

// inspectLarge decides about a message of a user refused writes that is
// larger than maxInspected, holding only its first maxInspected bytes: a
// write whose payload starts there is answered as refused and the rest of
// it discarded as it comes; anything else ends the session, as no Kopia
// client sends it.
func (b *guardedBody) inspectLarge(src io.Reader, why error, length uint32) error {
	head := make([]byte, maxInspected)
	if _, err := io.ReadFull(src, head); err != nil {
		return unexpectedEOF(err)
	}
	id, err := inspectWriteHead(head)
	if err != nil {
		return b.refuse(grpcInvalidArgument, fmt.Sprintf("%s: a message of %d bytes that is no write the gate can read: %v", refusedWrite(why), length, err))
	}
	if _, err := io.CopyN(io.Discard, src, int64(length)-maxInspected); err != nil {
		return unexpectedEOF(err)
	}
	b.log.V(1).Info("write refused", "user", b.user, "why", why.Error())
	b.answers.answer(refusal(id, refusedWrite(why)))
	return nil
}

// inspectWriteHead reads head, the start of a SessionRequest, and returns
// its request ID when a write's payload (write_content, put_manifest)
// begins in it and runs past its end, as in every large request of a
// Kopia client (its request ID comes first). Fields after that payload
// are not seen: a message that would name another request after it is
// answered as the write it began as, which it is to no client but a
// hostile one.
func inspectWriteHead(head []byte) (requestID int64, err error) {
	for len(head) > 0 {
		num, typ, n := protowire.ConsumeTag(head)
		if n < 0 {
			return 0, fmt.Errorf("a field's tag: %w", protowire.ParseError(n))
		}
		head = head[n:]
		if num == fieldRequestID && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(head)
			if n < 0 {
				return 0, fmt.Errorf("request_id: %w", protowire.ParseError(n))
			}
			requestID, head = int64(v), head[n:]
			continue
		}
		if typ == protowire.BytesType {
			size, n := protowire.ConsumeVarint(head)
			if n < 0 {
				return 0, fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
			}
			if size > uint64(len(head)-n) {
				if num == fieldWriteContent || num == fieldPutManifest {
					return requestID, nil
				}
				return 0, fmt.Errorf("field %d runs past the first %d bytes", num, maxInspected)
			}
			head = head[n+int(size):]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, head); n < 0 {
			return 0, fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		head = head[n:]
	}
	return 0, fmt.Errorf("no field runs past the first %d bytes", maxInspected)
}

// readMessage reads the length bytes of the message of prefix from src,
// at most maxInspected, and returns the message, its prefix included.
func readMessage(src io.Reader, prefix [prefixLen]byte, length uint32) ([]byte, error) {
	msg := make([]byte, prefixLen+int(length))
	copy(msg, prefix[:])
	if _, err := io.ReadFull(src, msg[prefixLen:]); err != nil {
		return nil, unexpectedEOF(err)
	}
	return msg, nil
}

// unexpectedEOF is err, io.ErrUnexpectedEOF for io.EOF: the stream ended
// inside a message.
func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// refuse ends the session with a gRPC status, and returns the error that
// ends its body.
func (b *guardedBody) refuse(code int, message string) error {
	b.log.Info("session ended: a message of a user refused writes that the gate would not pass on", "user", b.user, "why", message)
	cause := &sessionRefusal{code: code, message: message}
	// Before the body ends, so that the Kopia server's answer, which ends
	// with it, is seen to end by the gate.
	b.end(cause)
	return cause
}

// Close closes the guest's body.
func (b *guardedBody) Close() error { return b.body.Close() }

// answerWriter is the ResponseWriter of a session whose writes may be
// refused: it passes the Kopia server's messages on, and writes the gate's
// answers in between, each at a message boundary. Its writes are
// serialized: the proxy's come from the handler's goroutine, the answers
// from the one that reads the guest's body.
type answerWriter struct {
	http.ResponseWriter

	mu sync.Mutex
	// f follows the messages written.
	f frames
	// open is whether the answer's headers were written and start a
	// stream of messages (no status among them): answers may go after.
	open bool
	// done is whether the handler is done with w: nothing more is written.
	done bool
	// queued are answers waiting for the stream to open or reach a
	// message boundary.
	queued [][]byte
}

// WriteHeader writes the answer's headers.
func (w *answerWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ResponseWriter.WriteHeader(code)
	w.opened(code)
}

// opened notes headers of status code written.
func (w *answerWriter) opened(code int) {
	// A status in the headers ends the stream there ("trailers only").
	if code == http.StatusOK && w.Header().Get("Grpc-Status") == "" {
		w.open = true
	}
}

// headersWritten is whether the answer's headers were written as a stream
// of messages.
func (w *answerWriter) headersWritten() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.open
}

// Write writes the Kopia server's messages, and the answers queued at the
// boundaries between them.
func (w *answerWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open {
		w.opened(http.StatusOK)
	}
	if len(w.queued) == 0 {
		n, err := w.ResponseWriter.Write(p)
		w.f.follow(p[:n])
		return n, err
	}
	written := 0
	for written < len(p) {
		if w.f.atBoundary() {
			if err := w.writeQueued(); err != nil {
				return written, err
			}
		}
		k := w.f.next(p[written:])
		n, err := w.ResponseWriter.Write(p[written : written+k])
		written += n
		if err != nil {
			return written, err
		}
	}
	if w.f.atBoundary() {
		return written, w.writeQueued()
	}
	return written, nil
}

// answer writes msg, a whole message, at once when the stream is open and
// between two messages, else when it gets there.
func (w *answerWriter) answer(msg []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return // the session is over: its guest gets no more answers
	}
	w.queued = append(w.queued, msg)
	if w.open && w.f.atBoundary() {
		if err := w.writeQueued(); err == nil {
			_ = http.NewResponseController(w.ResponseWriter).Flush()
		}
	}
}

// writeQueued writes the answers queued, at a message boundary.
func (w *answerWriter) writeQueued() error {
	for len(w.queued) > 0 && w.open && !w.done {
		if _, err := w.ResponseWriter.Write(w.queued[0]); err != nil {
			return err
		}
		w.queued = w.queued[1:]
	}
	return nil
}

// FlushError flushes what was written (the proxy flushes each write).
func (w *answerWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError, for an http.Flusher.
func (w *answerWriter) Flush() { _ = w.FlushError() }

// Unwrap is the ResponseWriter w writes to, for http.ResponseController.
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// close ends w's writes, before its handler returns: answers still queued
// (the stream ended inside one of Kopia's messages) are dropped.
func (w *answerWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	w.queued = nil
}

// endedBody is the Kopia server's answer to a session: once the gate ended
// the session (sessionRefusal), its end is the answer's end, so that the
// proxy finishes it and the gate adds its status, rather than resetting
// the guest's stream.
type endedBody struct {
	io.ReadCloser
	// ctx is the session's.
	ctx context.Context
}

func (b *endedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && refusalOf(b.ctx) != nil {
		return n, io.EOF
	}
	return n, err
}

// refusalOf is why the gate ended the session of ctx, nil when it did not
// end it for a message it would not pass on.
func refusalOf(ctx context.Context) *sessionRefusal {
	var refused *sessionRefusal
	if errors.As(context.Cause(ctx), &refused) {
		return refused
	}
	return nil
}
