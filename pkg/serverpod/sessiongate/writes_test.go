package sessiongate_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/fs/virtualfs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/hashing"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/repo/object"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"github.com/kopia/kopia/snapshot/snapshotfs"
	"github.com/kopia/kopia/snapshot/upload"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

// writeGuard is a sessiongate.WriteGuard whose refusals a spec sets: user
// sync's quota, in a server pod.
type writeGuard struct {
	mu      sync.Mutex
	refused map[string]error
}

func (g *writeGuard) RefusesWrites(user string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused[user]
}

// refuse makes the guard refuse user's writes for why; nil: no longer.
func (g *writeGuard) refuse(user string, why error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refused == nil {
		g.refused = map[string]error{}
	}
	g.refused[user] = why
}

// snapshotFiles takes a snapshot of files (name: content) as username,
// through r, as `kopia snapshot create` does: an upload and its manifest
// in one write session, flushed at its end.
func snapshotFiles(r repo.Repository, username, path string, files map[string]string) (manifest.ID, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	user, host, _ := strings.Cut(username, "@")
	source := snapshot.SourceInfo{UserName: user, Host: host, Path: path}
	var id manifest.ID
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "snapshot create"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		tree, err := policy.TreeForSource(ctx, w, source)
		if err != nil {
			return err
		}
		var entries []fs.Entry
		for name, data := range files {
			entries = append(entries, virtualfs.StreamingFileFromReader(name, io.NopCloser(strings.NewReader(data))))
		}
		man, err := upload.NewUploader(w).Upload(ctx, virtualfs.NewStaticDirectory("data", entries), tree, source)
		if err != nil {
			return err
		}
		id, err = snapshot.SaveSnapshot(ctx, w, man)
		return err
	})
	return id, err
}

// readSnapshot reads the files of username's snapshots of path through r,
// as `kopia snapshot list` and `kopia restore` do.
func readSnapshot(r repo.Repository, username, path string) ([]map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	user, host, _ := strings.Cut(username, "@")
	mans, err := snapshot.ListSnapshots(ctx, r, snapshot.SourceInfo{UserName: user, Host: host, Path: path})
	if err != nil {
		return nil, fmt.Errorf("list the snapshots: %w", err)
	}
	var all []map[string]string
	for _, man := range mans {
		files := map[string]string{}
		err := fs.IterateEntries(ctx, snapshotfs.DirectoryEntry(r, man.RootObjectID(), nil), func(ctx context.Context, e fs.Entry) error {
			or, err := r.OpenObject(ctx, e.(object.HasObjectID).ObjectID())
			if err != nil {
				return err
			}
			defer or.Close()
			data, err := io.ReadAll(or)
			files[e.Name()] = string(data)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("read snapshot %s: %w", man.ID, err)
		}
		all = append(all, files)
	}
	return all, nil
}

// Per-VM quota: a VM over its backup quota may read and restore its
// snapshots, and may not add to the repository. Kopia's server cannot tell
// (it trusts a session's read_only flag, which the guest sets), so the gate
// refuses each write of the session itself, answering it with the reason;
// the session goes on.
var _ = Describe("The writes of a user its VM's quota refuses", Ordered, func() {
	const (
		full  = "full@team-d"
		other = "other@team-d"
		path  = "/data"
		// why is what user sync would say.
		why = "VM team-d/full is over its backup quota (5 GiB used of 4 GiB)"
	)
	var (
		fullPassword, otherPassword = testbed.RandomPassword(), testbed.RandomPassword()
		guard                       = &writeGuard{}
		url                         string
		fullRepo                    repo.Repository
		firstFiles                  = map[string]string{"notes.txt": "written before the quota was reached"}
		// seen is what the guest's kopia is told.
		seen = "guestbackup: " + why
	)
	BeforeAll(func() {
		server.AddUser(GinkgoT(), full, fullPassword)
		server.AddUser(GinkgoT(), other, otherPassword)
		_, url = startGate(sessiongate.Options{Writes: guard})
		var err error
		fullRepo, err = holdSessionAt(url, full, fullPassword)
		Expect(err).NotTo(HaveOccurred())
		_, err = snapshotFiles(fullRepo, full, path, firstFiles)
		Expect(err).NotTo(HaveOccurred(), "a snapshot while the user is not refused")
	})

	It("fails its snapshot with the gate's reason, while its snapshots can be listed and read", func() {
		guard.refuse(full, errors.New(why))
		DeferCleanup(func() { guard.refuse(full, nil) })

		_, err := snapshotFiles(fullRepo, full, path, map[string]string{"more.txt": "over the quota"})
		Expect(err).To(MatchError(ContainSubstring(seen)), "what `kopia snapshot create` says")

		snapshots, err := readSnapshot(fullRepo, full, path)
		Expect(err).NotTo(HaveOccurred(), "reads pass")
		Expect(snapshots).To(Equal([]map[string]string{firstFiles}), "the refused snapshot is not there, the earlier one is whole")
	})

	It("fails the guest's own `kopia snapshot create` with the gate's reason, while `kopia snapshot list` works", func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		guest := testbed.NewKopiaClient(GinkgoT())
		out, err := guest.ConnectPinned(ctx, url, server.CAPin, full, fullPassword)
		Expect(err).NotTo(HaveOccurred(), out)
		data := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(data, "notes.txt"), []byte("over the quota"), 0o600)).To(Succeed())
		guard.refuse(full, errors.New(why))
		DeferCleanup(func() { guard.refuse(full, nil) })

		out, err = guest.RunWithPassword(ctx, fullPassword, "snapshot", "create", data)
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(seen), "what the guest's kopia says")
		ids, err := guest.SnapshotIDs(ctx, path)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1), "the snapshot taken before the quota was reached")
	})

	It("lets the same session write again once its user is no longer refused, and never touches another user's", func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, w, err := fullRepo.NewWriter(ctx, repo.WriteSessionOptions{Purpose: "a long command"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(w.Close, context.Background())
		labels := map[string]string{manifest.TypeLabelKey: "snapshot", snapshot.UsernameLabel: "full", snapshot.HostnameLabel: "team-d", snapshot.PathLabel: "/manual"}
		started := sessionsStarted(full)

		guard.refuse(full, errors.New(why))
		otherRepo, err := holdSessionAt(url, other, otherPassword)
		Expect(err).NotTo(HaveOccurred())
		// other's snapshot goes on alongside full's refused writes.
		otherDone := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			_, err := snapshotFiles(otherRepo, other, path, map[string]string{"other.txt": "not over any quota"})
			otherDone <- err
		}()
		_, err = w.PutManifest(ctx, labels, map[string]string{"try": "refused"})
		Expect(err).To(MatchError(ContainSubstring(seen)))
		Expect(<-otherDone).To(Succeed(), "another user's snapshot is not refused")
		snapshots, err := readSnapshot(otherRepo, other, path)
		Expect(err).NotTo(HaveOccurred())
		Expect(snapshots).To(HaveLen(1))

		guard.refuse(full, nil)
		id, err := w.PutManifest(ctx, labels, map[string]string{"try": "accepted"})
		Expect(err).NotTo(HaveOccurred(), "the same session writes again, with nothing done in the guest")
		Expect(w.Flush(ctx)).To(Succeed())
		Expect(sessionsStarted(full)).To(Equal(started), "no session was opened: the writer's, open before the refusal, made both writes")
		found, err := fullRepo.FindManifests(ctx, labels)
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(ConsistOf(HaveField("ID", id)), "only the write made after the refusal ended")
	})

	Context("sent by hand, as a hostile guest may encode it", func() {
		var s *rawSession
		BeforeEach(func() {
			guard.refuse(full, errors.New(why))
			DeferCleanup(func() { guard.refuse(full, nil) })
			s = openRawSession(url, full, fullPassword)
		})

		// refusedThenWritten sends write, whose request is requestID,
		// to the gate while full is refused, and sees that the gate
		// answers it and that the content it would write (data) does not
		// exist; then, full no longer refused, sends it again, and sees
		// Kopia write it: the message was one Kopia takes for a write.
		refusedThenWritten := func(requestID int64, write []byte, data string) {
			GinkgoHelper()
			id := s.contentID(data)
			s.send(write)
			Expect(s.recv()).To(Equal(rawResponse{requestID: requestID, field: 2, errorCode: 5, errorMessage: seen}), "the gate's answer")
			s.send(grpcMessage(0, contentInfoRequest(requestID+1, id)))
			Expect(s.recv().errorCode).To(Equal(uint64(2)), "Kopia has no such content (CONTENT_NOT_FOUND)")

			guard.refuse(full, nil)
			s.send(write)
			written := s.recv()
			Expect(written.field).To(Equal(protowire.Number(13)), "Kopia writes it once full is not refused: %+v", written)
			Expect(written.requestID).To(Equal(requestID))
			s.send(grpcMessage(0, contentInfoRequest(requestID+1, id)))
			Expect(s.recv().field).To(Equal(protowire.Number(11)), "the content is there now")
		}

		It("refuses a write_content put before its request_id", func() {
			data := "hostile 1 " + testbed.RandomPassword()
			msg := withRequestID(withField(nil, 13, writeContentRequest(data)), 7)
			refusedThenWritten(7, grpcMessage(0, msg), data)
		})

		It("refuses a message of two requests whose last is a write_content", func() {
			data := "hostile 2 " + testbed.RandomPassword()
			msg := sessionRequest(3, 14, withField(nil, 1, []byte("0123456789abcdef0123456789abcdef")))
			msg = withField(msg, 13, writeContentRequest(data))
			// A request_id given twice: the last counts.
			refusedThenWritten(9, grpcMessage(0, withRequestID(msg, 9)), data)
		})

		It("ends the session of a compressed message, which never reaches Kopia", func() {
			labels := map[string]string{manifest.TypeLabelKey: "snapshot", snapshot.UsernameLabel: "full", snapshot.HostnameLabel: "team-d", snapshot.PathLabel: "/compressed"}
			var zipped bytes.Buffer
			z := gzip.NewWriter(&zipped)
			_, _ = z.Write(sessionRequest(4, 16, putManifestRequest(labels)))
			Expect(z.Close()).To(Succeed())
			s.send(grpcMessage(1, zipped.Bytes()))
			// Ended by the guest: Kopia, had it got the message, would
			// answer it and end the session with OK.
			Expect(s.body.Close()).To(Succeed())
			status, message := s.status()
			Expect(status).To(Equal("3"), "InvalidArgument, from the gate: %s", message)
			Expect(message).To(ContainSubstring(seen + ": a compressed message"))

			guard.refuse(full, nil)
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			found, err := fullRepo.FindManifests(ctx, labels)
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeEmpty())
		})

		It("ends a session whose first message is compressed, before Kopia answers", func() {
			var zipped bytes.Buffer
			z := gzip.NewWriter(&zipped)
			_, _ = z.Write(initializeSession())
			Expect(z.Close()).To(Succeed())
			s := startRawSession(url, full, fullPassword, grpcMessage(1, zipped.Bytes()))
			// Kopia, had it got the message, would answer it and end the
			// session with OK.
			Expect(s.body.Close()).To(Succeed())
			status, message := s.status()
			Expect(status).To(Equal("3"), "InvalidArgument, from the gate: %s", message)
			Expect(message).To(ContainSubstring(seen + ": a compressed message"))
		})
	})
})

// rawSession is a Kopia session sent by hand, message by message, over
// HTTP/2: what a hostile guest can send.
type rawSession struct {
	body   *io.PipeWriter
	res    *http.Response
	params *rawParameters
}

// rawParameters are the repository's parameters, from Kopia's first
// answer (InitializeSessionResponse.parameters).
type rawParameters struct{ hash, secret []byte }

func (p *rawParameters) GetHashFunction() string { return string(p.hash) }
func (p *rawParameters) GetHmacSecret() []byte   { return p.secret }

// initializeSession is the first request of a session, as a client
// sends it.
func initializeSession() []byte {
	return sessionRequest(1, 10, withField(nil, 1, []byte("by hand")))
}

// openRawSession opens a session as username through the gate at url,
// its first message the initialization a client sends, and reads Kopia's
// answer to it. The session ends with the spec.
func openRawSession(url, username, password string) *rawSession {
	GinkgoHelper()
	s := startRawSession(url, username, password, grpcMessage(0, initializeSession()))
	Expect(s.res.Header.Get("Grpc-Status")).To(BeEmpty(), "Kopia accepted the session: %s", s.res.Header.Get("Grpc-Message"))
	first := s.recv()
	Expect(first.field).To(Equal(protowire.Number(10)), "InitializeSessionResponse")
	params, err := fieldBytes(first.body, 1)
	Expect(err).NotTo(HaveOccurred())
	s.params = &rawParameters{}
	s.params.hash, err = fieldBytes(params, 1)
	Expect(err).NotTo(HaveOccurred())
	s.params.secret, err = fieldBytes(params, 2)
	Expect(err).NotTo(HaveOccurred())
	return s
}

// startRawSession starts a session as username through the gate at url,
// its first message first, and returns once the answer's headers are in.
func startRawSession(url, username, password string, first []byte) *rawSession {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	DeferCleanup(cancel)
	body, hold := io.Pipe()
	DeferCleanup(hold.Close)
	context.AfterFunc(ctx, func() { hold.CloseWithError(ctx.Err()) })
	go func() { _, _ = hold.Write(first) }()
	req, err := testbed.NewKopiaSessionRequest(ctx, url, username, password, body)
	Expect(err).NotTo(HaveOccurred())
	// Messages may come compressed, as gRPC lets a client say (Kopia's
	// never does).
	req.Header.Set("Grpc-Encoding", "gzip")
	a := newAttacker(url, server.CA.Cert, net.IPv4(127, 0, 0, 1))
	DeferCleanup(a.close)
	res, err := a.client.Do(req)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(res.Body.Close)
	return &rawSession{body: hold, res: res}
}

// send sends a gRPC message (grpcMessage).
func (s *rawSession) send(msg []byte) {
	GinkgoHelper()
	_, err := s.body.Write(msg)
	Expect(err).NotTo(HaveOccurred())
}

// rawResponse is a SessionResponse: its request ID, the field of its
// oneof, that field's message, and an ErrorResponse's code and message.
type rawResponse struct {
	requestID    int64
	field        protowire.Number
	body         []byte
	errorCode    uint64
	errorMessage string
}

// recv reads the session's next answer.
func (s *rawSession) recv() rawResponse {
	GinkgoHelper()
	var prefix [5]byte
	_, err := io.ReadFull(s.res.Body, prefix[:])
	Expect(err).NotTo(HaveOccurred(), "an answer")
	msg := make([]byte, binary.BigEndian.Uint32(prefix[1:]))
	_, err = io.ReadFull(s.res.Body, msg)
	Expect(err).NotTo(HaveOccurred())
	if prefix[0] == 1 {
		// Kopia's server compresses its answers as the session asked.
		z, err := gzip.NewReader(bytes.NewReader(msg))
		Expect(err).NotTo(HaveOccurred())
		msg, err = io.ReadAll(z)
		Expect(err).NotTo(HaveOccurred())
	}
	var r rawResponse
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		Expect(n).To(BeNumerically(">", 0))
		msg = msg[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(msg)
			Expect(n).To(BeNumerically(">", 0))
			r.requestID, msg = int64(v), msg[n:]
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(msg)
			Expect(n).To(BeNumerically(">", 0))
			r.field, r.body, msg = num, v, msg[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, msg)
			Expect(n).To(BeNumerically(">", 0))
			msg = msg[n:]
		}
	}
	if r.field == 2 {
		for e := r.body; len(e) > 0; {
			num, typ, n := protowire.ConsumeTag(e)
			Expect(n).To(BeNumerically(">", 0))
			e = e[n:]
			switch {
			case num == 1 && typ == protowire.VarintType:
				r.errorCode, n = protowire.ConsumeVarint(e)
			case num == 2 && typ == protowire.BytesType:
				var m []byte
				m, n = protowire.ConsumeBytes(e)
				r.errorMessage = string(m)
			default:
				n = protowire.ConsumeFieldValue(num, typ, e)
			}
			Expect(n).To(BeNumerically(">", 0))
			e = e[n:]
		}
		r.body = nil
	}
	return r
}

// status reads the session to its end, and returns its gRPC status, from
// the trailers or, in an answer of a status alone, the headers.
func (s *rawSession) status() (code, message string) {
	GinkgoHelper()
	_, err := io.Copy(io.Discard, s.res.Body)
	Expect(err).NotTo(HaveOccurred(), "the session ends with a status, not a reset stream")
	h := s.res.Trailer
	if s.res.Header.Get("Grpc-Status") != "" {
		h = s.res.Header
	}
	// Percent-encoded, as gRPC says.
	message, err = neturl.PathUnescape(h.Get("Grpc-Message"))
	Expect(err).NotTo(HaveOccurred())
	return h.Get("Grpc-Status"), message
}

// contentID is the ID Kopia gives a content of data, as its client
// computes it (grpcRepositoryClient.WriteContent), with the repository's
// own hash function.
func (s *rawSession) contentID(data string) content.ID {
	GinkgoHelper()
	hash, err := hashing.CreateHashFunc(s.params)
	Expect(err).NotTo(HaveOccurred())
	id, err := content.IDFromHash("", hashOf(hash, []byte(data)))
	Expect(err).NotTo(HaveOccurred())
	return id
}

// grpcMessage is msg with its gRPC prefix: flag (1: compressed) and length.
func grpcMessage(flag byte, msg []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{flag}, uint32(len(msg))), msg...)
}

// sessionRequest is a SessionRequest: its ID, then request (the encoded
// message) as the field of its oneof.
func sessionRequest(requestID int64, field protowire.Number, request []byte) []byte {
	return withField(withRequestID(nil, requestID), field, request)
}

// withRequestID appends a SessionRequest's request_id to msg.
func withRequestID(msg []byte, requestID int64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(msg, 1, protowire.VarintType), uint64(requestID))
}

// withField appends field num, of wire type bytes, to msg.
func withField(msg []byte, num protowire.Number, value []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(msg, num, protowire.BytesType), value)
}

// contentInfoRequest is a SessionRequest of a GetContentInfoRequest of
// id.
func contentInfoRequest(requestID int64, id content.ID) []byte {
	return sessionRequest(requestID, 11, withField(nil, 1, []byte(id.String())))
}

// writeContentRequest is a WriteContentRequest of data, no prefix, not
// compressed.
func writeContentRequest(data string) []byte {
	return withField(nil, 2, []byte(data))
}

// putManifestRequest is a PutManifestRequest of an empty JSON object with
// labels.
func putManifestRequest(labels map[string]string) []byte {
	m := withField(nil, 1, []byte("{}"))
	for k, v := range labels {
		m = withField(m, 2, withField(withField(nil, 1, []byte(k)), 2, []byte(v)))
	}
	return m
}

// fieldBytes is the last field num of message msg, of wire type bytes.
func fieldBytes(msg []byte, num protowire.Number) ([]byte, error) {
	var found []byte
	for len(msg) > 0 {
		n, typ, l := protowire.ConsumeTag(msg)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		msg = msg[l:]
		if n == num && typ == protowire.BytesType {
			found, l = protowire.ConsumeBytes(msg)
		} else {
			l = protowire.ConsumeFieldValue(n, typ, msg)
		}
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		msg = msg[l:]
	}
	return found, nil
}

// hashOf is hash of data. Kopia's hash functions take a gather.Bytes, of
// a package internal to Kopia: outside it, only reflection builds one.
func hashOf(hash hashing.HashFunc, data []byte) []byte {
	fn := reflect.ValueOf(hash)
	arg := reflect.New(fn.Type().In(1)).Elem()
	arg.FieldByName("Slices").Set(reflect.ValueOf([][]byte{data}))
	return fn.Call([]reflect.Value{reflect.ValueOf([]byte(nil)), arg})[0].Bytes()
}
