package sessiongate

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/encoding/protowire"
)

// discardWriter is a ResponseWriter that costs nothing, so that what the
// gate adds shows.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}

// requestStream is a stream of n requests (field) of size bytes each.
func requestStream(field protowire.Number, n, size int) []byte {
	var out []byte
	for i := range n {
		var req []byte
		req = protowire.AppendTag(req, fieldRequestID, protowire.VarintType)
		req = protowire.AppendVarint(req, uint64(i))
		req = protowire.AppendTag(req, field, protowire.BytesType)
		req = protowire.AppendBytes(req, protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), make([]byte, size)))
		out = append(out, framed(0, req)...)
	}
	return out
}

// BenchmarkSessionStream measures what a session's bytes cost through the
// gate's guard, each way, for a user it does not refuse (the frames
// followed, no message copied) next to a plain copy, with Kopia-sized
// messages (a 4 MiB content, as a snapshot writes; 100 bytes, as a
// listing's requests) and the proxy's 32 KiB buffer. "refused" is a refused
// user's reads (each message held whole and parsed), for scale.
func BenchmarkSessionStream(b *testing.B) {
	for _, size := range []int{100, 4 << 20} {
		stream := requestStream(fieldWriteContent, max(1, (16<<20)/size), size)
		buf := make([]byte, 32<<10)
		b.Run(fmt.Sprintf("request/plain/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				_, _ = io.CopyBuffer(io.Discard, onlyReader{bytes.NewReader(stream)}, buf)
			}
		})
		b.Run(fmt.Sprintf("request/guarded/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			guard := &switchGuard{}
			for b.Loop() {
				body := &guardedBody{body: io.NopCloser(bytes.NewReader(stream)), user: "vm@ns", guard: guard, answers: &answerWriter{}, end: func(error) {}, log: logr.Discard()}
				_, _ = io.CopyBuffer(io.Discard, onlyReader{body}, buf)
			}
		})
		b.Run(fmt.Sprintf("response/plain/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			w := &discardWriter{h: http.Header{}}
			for b.Loop() {
				_, _ = io.CopyBuffer(onlyWriter{w}, onlyReader{bytes.NewReader(stream)}, buf)
			}
		})
		b.Run(fmt.Sprintf("response/guarded/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				w := &answerWriter{ResponseWriter: &discardWriter{h: http.Header{}}}
				_, _ = io.CopyBuffer(onlyWriter{w}, onlyReader{bytes.NewReader(stream)}, buf)
			}
		})
		b.Run(fmt.Sprintf("request/refused/%dB", size), func(b *testing.B) {
			// Reads, which pass: the same stream as get_content requests.
			reads := requestStream(14, max(1, (16<<20)/size), size)
			b.SetBytes(int64(len(reads)))
			b.ReportAllocs()
			guard := &switchGuard{}
			guard.refused.Store(true)
			for b.Loop() {
				body := &guardedBody{body: io.NopCloser(bytes.NewReader(reads)), user: "vm@ns", guard: guard, answers: &answerWriter{}, end: func(error) {}, log: logr.Discard()}
				if _, err := io.CopyBuffer(io.Discard, onlyReader{body}, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// onlyReader and onlyWriter hide WriterTo and ReaderFrom, so that io.Copy
// goes through a buffer as the proxy does.
type onlyReader struct{ io.Reader }
type onlyWriter struct{ io.Writer }
