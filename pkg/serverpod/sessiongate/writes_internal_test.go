package sessiongate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/iotest"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/encoding/protowire"
)

// request encodes a SessionRequest of fields given in order: a request ID
// (int64) or a request (protowire.Number, its message empty but for a
// byte).
func request(fields ...any) []byte {
	var m []byte
	for _, f := range fields {
		switch f := f.(type) {
		case int64:
			m = protowire.AppendTag(m, fieldRequestID, protowire.VarintType)
			m = protowire.AppendVarint(m, uint64(f))
		case protowire.Number:
			m = protowire.AppendTag(m, f, protowire.BytesType)
			m = protowire.AppendBytes(m, []byte{0x12, 0x01, 'x'})
		}
	}
	return m
}

// framed is msg with a gRPC prefix of flag.
func framed(flag byte, msg []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{flag}, uint32(len(msg))), msg...)
}

func TestInspectRequest(t *testing.T) {
	appendTo := func(m []byte, num protowire.Number, typ protowire.Type, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(m, num, typ), v)
	}
	for _, tc := range []struct {
		name   string
		msg    []byte
		id     int64
		writes bool
		err    bool
	}{
		{name: "write_content as Kopia's client sends it", msg: request(int64(4), fieldWriteContent), id: 4, writes: true},
		{name: "put_manifest", msg: request(int64(5), fieldPutManifest), id: 5, writes: true},
		{name: "get_content", msg: request(int64(6), protowire.Number(14)), id: 6},
		{name: "find_manifests", msg: request(int64(6), protowire.Number(17)), id: 6},
		{name: "flush", msg: request(int64(6), protowire.Number(12)), id: 6},
		{name: "delete_manifest frees space", msg: request(int64(6), protowire.Number(18)), id: 6},
		{name: "apply_retention_policy frees space", msg: request(int64(6), protowire.Number(20)), id: 6},
		{name: "initialize_session", msg: request(int64(0), protowire.Number(10))},
		{name: "the request before its ID", msg: request(fieldWriteContent, int64(7)), id: 7, writes: true},
		{name: "no ID", msg: request(fieldPutManifest), writes: true},
		{name: "the ID twice: the last counts", msg: request(int64(1), fieldWriteContent, int64(9)), id: 9, writes: true},
		{name: "a read, then a write: the last counts", msg: request(int64(3), protowire.Number(14), fieldWriteContent), id: 3, writes: true},
		{name: "a write, then a read: the last counts", msg: request(int64(3), fieldWriteContent, protowire.Number(14)), id: 3},
		{name: "a write given twice", msg: request(int64(3), fieldPutManifest, fieldPutManifest), id: 3, writes: true},
		{name: "no request", msg: request(int64(3)), id: 3},
		{name: "empty"},
		{name: "a negative ID", msg: request(int64(-2), fieldWriteContent), id: -2, writes: true},
		{name: "an unknown field after the write", msg: appendTo(request(int64(3), fieldWriteContent), 40, protowire.VarintType, 1), id: 3, writes: true},
		{name: "a request as a varint", msg: appendTo(request(int64(3), protowire.Number(14)), fieldWriteContent, protowire.VarintType, 1), err: true},
		{name: "the ID as bytes", msg: protowire.AppendBytes(protowire.AppendTag(request(fieldWriteContent), fieldRequestID, protowire.BytesType), []byte{1}), err: true},
		{name: "truncated", msg: request(int64(3), fieldWriteContent)[:5], err: true},
		{name: "field number 0", msg: appendTo(nil, 0, protowire.VarintType, 1), err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, writes, err := inspectRequest(tc.msg)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if err == nil && (id != tc.id || writes != tc.writes) {
				t.Errorf("got ID %d, writes %v; want %d, %v", id, writes, tc.id, tc.writes)
			}
		})
	}
}

// answerOf reads a SessionResponse that refusal wrote.
func answerOf(t *testing.T, msg []byte) (id int64, code uint64, message string) {
	t.Helper()
	if len(msg) < prefixLen || msg[0] != 0 || int(binary.BigEndian.Uint32(msg[1:])) != len(msg)-prefixLen {
		t.Fatalf("not one uncompressed gRPC message: %x", msg)
	}
	var e []byte
	for m := msg[prefixLen:]; len(m) > 0; {
		num, typ, n := protowire.ConsumeTag(m)
		m = m[n:]
		switch {
		case num == fieldRequestID && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(m)
			id = int64(v)
		case num == fieldError && typ == protowire.BytesType:
			e, n = protowire.ConsumeBytes(m)
		default:
			t.Fatalf("field %d of type %d", num, typ)
		}
		m = m[n:]
	}
	for len(e) > 0 {
		num, _, n := protowire.ConsumeTag(e)
		e = e[n:]
		switch num {
		case fieldErrorCode:
			code, n = protowire.ConsumeVarint(e)
		case fieldErrorMessage:
			var b []byte
			b, n = protowire.ConsumeBytes(e)
			message = string(b)
		}
		e = e[n:]
	}
	return id, code, message
}

func TestRefusal(t *testing.T) {
	for _, id := range []int64{0, 1, 300, -1} {
		gotID, code, message := answerOf(t, refusal(id, "guestbackup: over quota"))
		if gotID != id || code != codeAccessDenied || message != "guestbackup: over quota" {
			t.Errorf("refusal(%d): ID %d, code %d, %q", id, gotID, code, message)
		}
	}
}

func TestFrames(t *testing.T) {
	stream := bytes.Join([][]byte{framed(0, nil), framed(0, make([]byte, 70000)), framed(1, []byte("abc")), framed(0, []byte("d"))}, nil)
	for _, chunk := range []int{1, 2, 5, 6, 7, 1000, len(stream)} {
		var f frames
		boundaries := 0
		for p := stream; len(p) > 0; {
			c := p[:min(chunk, len(p))]
			p = p[len(c):]
			for len(c) > 0 {
				c = c[f.next(c):]
				if f.atBoundary() {
					boundaries++
				}
			}
		}
		if boundaries != 4 || !f.atBoundary() {
			t.Errorf("chunks of %d: %d boundaries, at one at the end: %v", chunk, boundaries, f.atBoundary())
		}
	}
}

// switchGuard refuses its user while refused is set.
type switchGuard struct{ refused atomic.Bool }

func (g *switchGuard) RefusesWrites(string) error {
	if g.refused.Load() {
		return errors.New("over quota")
	}
	return nil
}

// guardedStream is a guardedBody of guard over body, its answers written
// to a recorder whose answer has started.
func guardedStream(guard WriteGuard, body io.Reader) (*guardedBody, *httptest.ResponseRecorder, *error) {
	rec := httptest.NewRecorder()
	answers := &answerWriter{ResponseWriter: rec}
	answers.WriteHeader(http.StatusOK)
	var ended error
	return &guardedBody{
		body: io.NopCloser(body), user: "vm@ns", guard: guard, answers: answers,
		end: func(cause error) { ended = cause }, log: logr.Discard(),
	}, rec, &ended
}

func TestGuardedBodyRefusesWritesOnly(t *testing.T) {
	msgs := [][]byte{
		framed(0, request(int64(0), protowire.Number(10))),
		framed(0, request(int64(1), protowire.Number(14))),
		framed(0, request(fieldWriteContent, int64(2))),
		framed(0, request(int64(3), protowire.Number(17), fieldPutManifest)),
		framed(0, request(int64(4), fieldPutManifest, protowire.Number(18))),
		framed(0, request(int64(5), protowire.Number(12))),
	}
	passed := bytes.Join([][]byte{msgs[0], msgs[1], msgs[4], msgs[5]}, nil)
	readers := map[string]func(io.Reader) io.Reader{
		"whole":       func(r io.Reader) io.Reader { return r },
		"byte a read": iotest.OneByteReader,
		"half a read": iotest.HalfReader,
		"with EOF":    iotest.DataErrReader,
	}
	for name, reader := range readers {
		t.Run(name, func(t *testing.T) {
			guard := &switchGuard{}
			guard.refused.Store(true)
			b, rec, ended := guardedStream(guard, reader(bytes.NewReader(bytes.Join(msgs, nil))))
			out, err := io.ReadAll(b)
			if err != nil || *ended != nil {
				t.Fatalf("read: %v, ended: %v", err, *ended)
			}
			if !bytes.Equal(out, passed) {
				t.Errorf("passed on %x, want %x", out, passed)
			}
			answers := rec.Body.Bytes()
			for _, want := range []int64{2, 3} {
				n := prefixLen + int(binary.BigEndian.Uint32(answers[1:]))
				id, code, message := answerOf(t, answers[:n])
				if id != want || code != codeAccessDenied || message != "guestbackup: over quota" {
					t.Errorf("answer: ID %d, code %d, %q; want ID %d", id, code, message, want)
				}
				answers = answers[n:]
			}
			if len(answers) != 0 {
				t.Errorf("more answers: %x", answers)
			}
		})
	}
}

func TestGuardedBodyAsksAtEachMessage(t *testing.T) {
	guard := &switchGuard{}
	pr, pw := io.Pipe()
	b, rec, _ := guardedStream(guard, pr)
	// The guest sends each message when told, after the guard turned: the
	// gate may be waiting for it already, and must ask once it is in.
	send := make(chan []byte, 4)
	go func() {
		for m := range send {
			_, _ = pw.Write(m)
		}
		pw.Close()
	}()
	read := func(want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(b, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %x (%v), want %x", got, err, want)
		}
	}
	write := framed(0, request(int64(1), fieldWriteContent))
	get := framed(0, request(int64(2), protowire.Number(14)))
	send <- write
	read(write)
	guard.refused.Store(true)
	send <- write
	send <- get
	read(get)
	guard.refused.Store(false)
	send <- write
	read(write)
	close(send)
	if _, err := b.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("end: %v", err)
	}
	if id, _, _ := answerOf(t, rec.Body.Bytes()); id != 1 {
		t.Errorf("answered %d", id)
	}
}

func TestGuardedBodyEndsSessionOnWhatItCannotRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
		code int
	}{
		{name: "compressed", msg: framed(1, request(int64(1), fieldWriteContent)), code: grpcInvalidArgument},
		{name: "unknown flag", msg: framed(2, request(int64(1), fieldWriteContent)), code: grpcInvalidArgument},
		{name: "malformed", msg: framed(0, []byte{0x6a, 0x40}), code: grpcInvalidArgument},
		{name: "above Kopia's limit", msg: binary.BigEndian.AppendUint32([]byte{0}, maxMessage+1), code: grpcResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guard := &switchGuard{}
			guard.refused.Store(true)
			first := framed(0, request(int64(0), protowire.Number(14)))
			b, rec, ended := guardedStream(guard, bytes.NewReader(append(append([]byte(nil), first...), tc.msg...)))
			out, err := io.ReadAll(b)
			var refused *sessionRefusal
			if !errors.As(err, &refused) || refused.code != tc.code || *ended != error(refused) {
				t.Fatalf("read: %v, ended: %v; want a refusal of code %d", err, *ended, tc.code)
			}
			if !bytes.Equal(out, first) || rec.Body.Len() != 0 {
				t.Errorf("passed on %x, answered %x", out, rec.Body.Bytes())
			}
		})
	}
	t.Run("cut short", func(t *testing.T) {
		guard := &switchGuard{}
		guard.refused.Store(true)
		b, _, _ := guardedStream(guard, bytes.NewReader(framed(0, request(int64(1), fieldWriteContent))[:8]))
		if _, err := io.ReadAll(b); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("read: %v", err)
		}
	})
	t.Run("not refused: passed on as it is", func(t *testing.T) {
		in := framed(1, []byte("compressed bytes"))
		b, _, _ := guardedStream(&switchGuard{}, bytes.NewReader(in))
		if out, err := io.ReadAll(b); err != nil || !bytes.Equal(out, in) {
			t.Errorf("read %x (%v)", out, err)
		}
	})
}

func TestAnswerWriterAnswersBetweenMessages(t *testing.T) {
	msg := func(s string) []byte { return framed(0, []byte(s)) }
	answer := refusal(7, "no")
	t.Run("before the headers: after them", func(t *testing.T) {
		rec := httptest.NewRecorder()
		w := &answerWriter{ResponseWriter: rec}
		w.answer(answer)
		if rec.Body.Len() != 0 || rec.Code != http.StatusOK || rec.Flushed {
			t.Fatalf("written before the headers: %x", rec.Body.Bytes())
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(msg("first"))
		if want := append(append([]byte(nil), answer...), msg("first")...); !bytes.Equal(rec.Body.Bytes(), want) {
			t.Errorf("wrote %x, want %x", rec.Body.Bytes(), want)
		}
	})
	t.Run("inside a message: at its end", func(t *testing.T) {
		rec := httptest.NewRecorder()
		w := &answerWriter{ResponseWriter: rec}
		w.WriteHeader(http.StatusOK)
		stream := append(msg("first"), msg("second")...)
		_, _ = w.Write(stream[:3])
		w.answer(answer)
		if rec.Body.Len() != 3 {
			t.Fatalf("written inside a message: %x", rec.Body.Bytes())
		}
		if n, err := w.Write(stream[3:]); n != len(stream)-3 || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
		want := bytes.Join([][]byte{msg("first"), answer, msg("second")}, nil)
		if !bytes.Equal(rec.Body.Bytes(), want) {
			t.Errorf("wrote %x, want %x", rec.Body.Bytes(), want)
		}
	})
	t.Run("between messages: at once, flushed", func(t *testing.T) {
		rec := httptest.NewRecorder()
		w := &answerWriter{ResponseWriter: rec}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(msg("first"))
		w.answer(answer)
		if !bytes.Equal(rec.Body.Bytes(), append(msg("first"), answer...)) || !rec.Flushed {
			t.Errorf("wrote %x, flushed %v", rec.Body.Bytes(), rec.Flushed)
		}
	})
	t.Run("a status in the headers, or the handler done: never", func(t *testing.T) {
		rec := httptest.NewRecorder()
		w := &answerWriter{ResponseWriter: rec}
		w.Header().Set("Grpc-Status", "7")
		w.WriteHeader(http.StatusOK)
		w.answer(answer)
		w.close()
		w.answer(answer)
		if rec.Body.Len() != 0 {
			t.Errorf("wrote %x", rec.Body.Bytes())
		}
	})
}

// large is a SessionRequest of ID id whose request field num carries size
// bytes, after a trace context of pad bytes.
func large(id int64, num protowire.Number, size, pad int) []byte {
	var m []byte
	if pad > 0 {
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendBytes(m, make([]byte, pad))
	}
	m = protowire.AppendTag(m, fieldRequestID, protowire.VarintType)
	m = protowire.AppendVarint(m, uint64(id))
	m = protowire.AppendTag(m, num, protowire.BytesType)
	return protowire.AppendBytes(m, make([]byte, size))
}

// A refused user's message larger than the gate holds is judged by its
// start: a write whose payload runs past it is answered, anything else
// ends the session, and the gate never holds more than maxInspected of it.
func TestGuardedBodyJudgesLargeMessagesByTheirStart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		msg      []byte
		answered int64 // the ID answered; -1: the session ends
	}{
		{name: "write_content of 4 MiB, as Kopia's client sends it", msg: large(7, fieldWriteContent, 4<<20, 0), answered: 7},
		{name: "put_manifest of 100 KiB", msg: large(8, fieldPutManifest, 100<<10, 0), answered: 8},
		{name: "a read of 1 MiB: no client sends one", msg: large(9, protowire.Number(14), 1<<20, 0), answered: -1},
		{name: "a write behind a trace context larger than the gate holds", msg: large(10, fieldWriteContent, 1<<20, maxInspected), answered: -1},
		{name: "a write behind a small trace context", msg: large(11, fieldWriteContent, 1<<20, 100), answered: 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guard := &switchGuard{}
			guard.refused.Store(true)
			next := framed(0, request(int64(12), protowire.Number(14)))
			b, rec, ended := guardedStream(guard, iotest.HalfReader(bytes.NewReader(append(framed(0, tc.msg), next...))))
			out, err := io.ReadAll(b)
			if tc.answered < 0 {
				if *ended == nil && err == nil {
					t.Fatalf("passed on %d bytes; want the session ended", len(out))
				}
				if len(out) != 0 {
					t.Errorf("passed on %d bytes of a message it ended the session for", len(out))
				}
				return
			}
			if err != nil || *ended != nil {
				t.Fatalf("read: %v, ended: %v", err, *ended)
			}
			if !bytes.Equal(out, next) {
				t.Errorf("passed on %d bytes, want the next message alone", len(out))
			}
			if id, code, _ := answerOf(t, rec.Body.Bytes()); id != tc.answered || code != codeAccessDenied {
				t.Errorf("answered ID %d, code %d; want %d refused", id, code, tc.answered)
			}
		})
	}
}
