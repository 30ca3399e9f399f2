package userset

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
)

// RequestsKey is the key of a users Secret that holds the requests
// addressed to its shard's users that their guests have yet to finish:
// JSON lines sorted by UID. The controller writes them where the server pod
// already watches (no Role grows for them), and a guest polls its server
// pod for its own (package clientdist). Nothing in a request is secret;
// it travels in the Secret because that is the channel the two sides share.
const RequestsKey = "requests"

// JobRequestsKey is the key of a users Secret that holds, in RequestsKey's
// format, the requests of its shard that restore Jobs carry out
// (Request.Job). They have a key of their own so that a server pod of a
// version that knows no Job, which reads RequestsKey alone, never hands
// one to a guest while an upgrade rolls: it lists none of them.
const JobRequestsKey = "job-requests"

// SplitJobs splits requests into those guests carry out and those Jobs do
// (Request.Job), each in its own key of a users Secret.
func SplitJobs(requests []Request) (guests, jobs []Request) {
	for _, r := range requests {
		if r.Job {
			jobs = append(jobs, r)
		} else {
			guests = append(guests, r)
		}
	}
	return guests, jobs
}

// MaxRequestsPerUser bounds the requests a users Secret lists for one
// user: the oldest wait their turn, so that a flood of requests to one VM
// grows neither the Secret nor the guest's work without bound.
const MaxRequestsPerUser = 4

// MaxRequestBytes bounds one request, encoded: the API lets a request name
// 64 paths of 4 KiB, which four requests of one VM would make more than a
// Secret may hold, and a shard the controller cannot write stops the
// server's users from changing.
const MaxRequestBytes = 16 << 10

// MaxRequestPaths bounds the paths of one request, as the API bounds a
// request's own (spec.paths): those a VM's annotation gives a request that
// names none are bounded the same.
const MaxRequestPaths = 64

// MaxShardRequestsBytes bounds the requests of one users Secret, encoded,
// with what their results will add to the shard's activity ConfigMap
// (ResultBytesPerPath for each path), well within what a Secret and a
// ConfigMap hold beside their users and guests: beyond it, the newest
// requests wait their turn.
const MaxShardRequestsBytes = 256 << 10

// MaxListingEntries and MaxListingBytes bound a dry run's listing as its
// result records it (entries, and their paths JSON-encoded), so that a
// shard's activity stays well within what a ConfigMap holds: beyond, the
// listing is truncated (its counts stay whole).
const (
	MaxListingEntries = 100
	MaxListingBytes   = 16 << 10
)

// resultBytes bounds a result's own fields in its shard's activity: its
// UID, phase and times, and its message (at most 512 bytes, as the server
// pod takes it, JSON-escaped).
const resultBytes = 4 << 10

// ResultBytesPerPath bounds what a request's result records in its
// shard's activity for one path, beside the path itself twice (a
// restore's step names the path and the snapshot's root): a snapshot's
// ID, times and counts, encoded.
const ResultBytesPerPath = 256

// RequestSnapshot is the kind of a request to snapshot now (GuestSnapshot).
const RequestSnapshot = "snapshot"

// RequestRestore is the kind of a request to restore paths of snapshots
// into the running guest (GuestRestore).
const RequestRestore = "restore"

// RequestKinds are the kinds a guest carries out.
var RequestKinds = []string{RequestSnapshot, RequestRestore}

// RequestTag is the Kopia tag a guest puts on each snapshot it takes for a
// request, whose UID is its value: the server pod finds the request's
// snapshots by it, in the repository, under the guest's own identity.
const RequestTag = "guestbackup-request"

// Request is one request to a guest.
type Request struct {
	// UID is the request object's UID: what the guest answers with.
	UID string `json:"uid"`
	// User is the Kopia identity of the guest that carries it out.
	User string `json:"user"`
	// Kind is one of RequestKinds.
	Kind string `json:"kind"`
	// Name is the request object's name, for the guest's log.
	Name string `json:"name"`
	// Paths are the absolute guest paths it concerns.
	Paths []string `json:"paths"`
	// Tags are Kopia tags for the snapshots it takes.
	Tags map[string]string `json:"tags,omitempty"`
	// Description is the snapshots' Kopia description.
	Description string `json:"description,omitempty"`

	// Source is the Kopia identity whose snapshots a restore reads: User
	// itself, or the identity User's restore grant names
	// (guestbackup.io/restore-from), whose snapshots its guest may read.
	Source string `json:"source,omitempty"`
	// SnapshotID chooses a restore's snapshot by ID; Before, the last one
	// started before it; neither, the latest. The server pod resolves
	// them against the repository when the guest starts the restore.
	SnapshotID string     `json:"snapshotID,omitempty"`
	Before     *time.Time `json:"before,omitempty"`
	// Target is the guest folder a restore writes each path under, at its
	// full path; "/" with InPlace.
	Target string `json:"target,omitempty"`
	// InPlace lets a restore replace what its paths hold in the guest;
	// without it, a restore writes only where nothing is.
	InPlace bool `json:"inPlace,omitempty"`
	// DryRun makes a restore a listing of what it would write, which the
	// server pod makes from the repository alone: no guest is handed it.
	DryRun bool `json:"dryRun,omitempty"`
	// History makes a dry run a listing of its one path's versions across
	// the source's snapshots instead.
	History bool `json:"history,omitempty"`
	// Job is a restore into a PersistentVolumeClaim, which a Job of the
	// request's namespace carries out under User's identity (package
	// restorejob), not the guest: a guest's poll never lists it, and the
	// Job's poll names its UID (clientdist.UIDParam). Target is then a
	// folder of the claim.
	Job bool `json:"job,omitempty"`

	// Order sorts a user's requests oldest first (Queued.Order), the order
	// its guest carries them out in: a restore asked after a snapshot
	// restores from it.
	Order string `json:"order,omitempty"`
}

var (
	uidPattern    = regexp.MustCompile(`^[0-9a-f-]{1,64}$`)
	namePattern   = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	tagKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
)

// Validate checks what a guest will act on: whoever wrote the Secret, a
// request names a valid identity, absolute clean paths, and tags that
// cannot pose as the request tag.
func (r Request) Validate() error {
	if !uidPattern.MatchString(r.UID) {
		return fmt.Errorf("request UID %q is not a UID", r.UID)
	}
	if err := identity.ValidateUsername(r.User); err != nil {
		return fmt.Errorf("request %s: %w", r.UID, err)
	}
	if !slices.Contains(RequestKinds, r.Kind) {
		return fmt.Errorf("request %s: kind %q is none of %v", r.UID, r.Kind, RequestKinds)
	}
	if !namePattern.MatchString(r.Name) {
		return fmt.Errorf("request %s: name %q is not an object name", r.UID, r.Name)
	}
	if len(r.Paths) == 0 {
		return fmt.Errorf("request %s names no path", r.UID)
	}
	if len(r.Paths) > MaxRequestPaths {
		return fmt.Errorf("request %s names %d paths, more than %d: name fewer, or snapshot the folders that hold them", r.UID, len(r.Paths), MaxRequestPaths)
	}
	for _, p := range r.Paths {
		if !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsAny(p, "\x00\n\r") {
			return fmt.Errorf("request %s: path %q is not a clean absolute path", r.UID, p)
		}
	}
	for k, v := range r.Tags {
		if !tagKeyPattern.MatchString(k) || k == RequestTag || strings.ContainsAny(v, "\x00\n\r") {
			return fmt.Errorf("request %s: tag %q is not a tag a request may set", r.UID, k)
		}
	}
	if strings.ContainsAny(r.Description, "\x00") {
		return fmt.Errorf("request %s: the description holds a NUL character", r.UID)
	}
	if len(r.Order) > 512 || strings.ContainsAny(r.Order, "\x00\n\r") {
		return fmt.Errorf("request %s: order %q is not an order", r.UID, r.Order)
	}
	if err := r.validateRestore(); err != nil {
		return fmt.Errorf("request %s: %w", r.UID, err)
	}
	if n := r.size(); n > MaxRequestBytes {
		return fmt.Errorf("request %s takes %d bytes, more than %d: name fewer or shorter paths, tags and description", r.UID, n, MaxRequestBytes)
	}
	return nil
}

// validateRestore checks a restore's own fields, and that a snapshot
// request carries none of them.
func (r Request) validateRestore() error {
	if r.Kind != RequestRestore {
		if r.Source != "" || r.SnapshotID != "" || r.Before != nil || r.Target != "" || r.InPlace || r.DryRun || r.History || r.Job {
			return fmt.Errorf("a %s request carries restore fields", r.Kind)
		}
		return nil
	}
	if err := identity.ValidateUsername(r.Source); err != nil {
		return fmt.Errorf("restore source: %w", err)
	}
	if r.SnapshotID != "" && !snapshotIDPattern.MatchString(r.SnapshotID) {
		return fmt.Errorf("snapshot ID %q is not a snapshot ID", r.SnapshotID)
	}
	if r.SnapshotID != "" && r.Before != nil {
		return fmt.Errorf("the snapshot is chosen by ID and by time at once")
	}
	if r.History && (!r.DryRun || len(r.Paths) != 1 || r.SnapshotID != "") {
		return fmt.Errorf("a history lists one path's versions across snapshots: a dry run of one path, chosen by no snapshot ID")
	}
	if !path.IsAbs(r.Target) || path.Clean(r.Target) != r.Target || strings.ContainsAny(r.Target, "\x00\n\r") {
		return fmt.Errorf("target %q is not a clean absolute path", r.Target)
	}
	if (r.Target == "/") != r.InPlace {
		return fmt.Errorf("target %q: only a restore in place writes over the guest's own paths (target /)", r.Target)
	}
	if r.Job && r.InPlace {
		return fmt.Errorf("a restore into a claim writes into a folder of its own, never in place")
	}
	if len(r.Tags) > 0 || r.Description != "" {
		return fmt.Errorf("a restore carries no tags or description")
	}
	// One path within another would be restored twice, the second time
	// through what the first wrote (a link of the snapshot, say).
	for _, p := range r.Paths {
		for _, q := range r.Paths {
			if p != q && Holds(q, p) {
				return fmt.Errorf("path %s lies within %s, which the restore writes already: name one of them", p, q)
			}
		}
	}
	return nil
}

// Holds reports whether path p is folder or lies below it (both clean and
// absolute): what a restore of folder writes, and what a snapshot of it
// holds.
func Holds(folder, p string) bool {
	return folder == p || folder == "/" || strings.HasPrefix(p, folder+"/")
}

// snapshotIDPattern is a Kopia manifest ID, as admission checks it.
var snapshotIDPattern = regexp.MustCompile(`^[0-9a-zA-Z]{1,64}$`)

// budget is what r takes of its shard's room: its encoding, and what its
// result will record in the shard's activity ConfigMap (its message, a
// step per path, a dry run's listing). With MaxRequestBytes and
// MaxRequestPaths, one request's is well under MaxShardRequestsBytes, so
// the oldest request of a shard is always listed.
func (r Request) budget() int {
	n := r.size() + resultBytes
	for _, p := range r.Paths {
		n += ResultBytesPerPath + 2*len(p)
	}
	if r.DryRun {
		n += MaxListingBytes + MaxListingEntries*ResultBytesPerPath
	}
	return n
}

// size is r's length, encoded.
func (r Request) size() int {
	line, _ := json.Marshal(r) // plain data: cannot fail
	return len(line) + 1
}

// SnapshotRequest is the Request that carries GuestSnapshot s to the guest
// of its VM, whose guestbackup.io/paths are vmPaths (they apply when s
// names none). Its error says, for the request's status, why s cannot be
// carried.
func SnapshotRequest(s *v1alpha1.GuestSnapshot, vmPaths []string) (Request, error) {
	paths := s.Spec.Paths
	if len(paths) == 0 {
		paths = vmPaths
	}
	if len(paths) == 0 {
		return Request{}, fmt.Errorf("the request names no path and the VM has no annotation %s: set spec.paths", v1alpha1.AnnotationPaths)
	}
	clean := make([]string, len(paths))
	for i, p := range paths {
		clean[i] = path.Clean(p)
	}
	r := Request{UID: string(s.UID), User: identity.OfVM(s.Spec.VM, s.Namespace), Kind: RequestSnapshot, Name: s.Name,
		Paths: clean, Tags: s.Spec.Tags, Description: s.Spec.Description}
	if err := r.Validate(); err != nil {
		return Request{}, fmt.Errorf("it cannot be handed to the guest: %w", err)
	}
	return r, nil
}

// RestoreRequest is the Request that carries GuestRestore g to the guest
// of its VM, whose annotations are vmAnnotations: the source's identity
// is the VM's own, or the one its restore grant names (RestoreFrom, the
// rule admission applied, checked again as the grant may have gone
// since). A restore into a claim is a Job's (Request.Job), into the
// claim's folder named after g (ClaimFolder). Its error says, for the
// request's status, why g cannot be carried out.
func RestoreRequest(g *v1alpha1.GuestRestore, vmAnnotations map[string]string) (Request, error) {
	r := Request{UID: string(g.UID), User: identity.OfVM(g.Spec.VM, g.Namespace), Kind: RequestRestore, Name: g.Name,
		SnapshotID: g.Spec.Snapshot.ID, DryRun: g.Spec.DryRun, History: g.Spec.History}
	r.Source = r.User
	if g.Spec.SourceVM != "" && g.Spec.SourceVM != g.Spec.VM {
		grant, refusal := RestoreFrom(g.Spec.VM, g.Namespace, vmAnnotations)
		r.Source = identity.OfVM(g.Spec.SourceVM, g.Namespace)
		if refusal != "" || grant == nil || grant.Source != r.Source {
			return Request{}, fmt.Errorf("VirtualMachine %s may no longer read the snapshots of %s: annotate it with %s=%s to grant it", g.Spec.VM, g.Spec.SourceVM, v1alpha1.AnnotationRestoreFrom, g.Spec.SourceVM)
		}
	}
	if b := g.Spec.Snapshot.Before; b != nil {
		t := b.UTC()
		r.Before = &t
	}
	switch t := g.Spec.Target; {
	case t.PersistentVolumeClaim != nil:
		r.Target, r.Job = ClaimFolder(g.Name), IntoClaim(g)
	case t.InPlace:
		r.Target, r.InPlace = "/", true
	case t.Directory != "":
		r.Target = path.Clean(t.Directory)
	default:
		r.Target = path.Join(v1alpha1.RestoresFolder, g.Name)
	}
	for _, p := range g.Spec.Paths {
		r.Paths = append(r.Paths, path.Clean(p))
	}
	if err := r.Validate(); err != nil {
		return Request{}, fmt.Errorf("it cannot be handed to the guest: %w", err)
	}
	return r, nil
}

// IntoClaim reports whether g restores into a claim, which a Job does
// (Request.Job); a dry run into one is the server's alone, as any dry run.
func IntoClaim(g *v1alpha1.GuestRestore) bool {
	return g.Spec.Target.PersistentVolumeClaim != nil && !g.Spec.DryRun
}

// ClaimFolder is the folder of its claim that a GuestRestore named name
// writes into (each path at its full path below it): one of its own, so
// that a restore into a claim that holds data overwrites none of it.
func ClaimFolder(name string) string {
	return "/" + name
}

// EncodeRequests renders requests as the content of a users Secret's
// RequestsKey, sorted by UID, so that unchanged requests give an unchanged
// Secret.
func EncodeRequests(requests []Request) []byte {
	sorted := slices.SortedFunc(slices.Values(requests), func(a, b Request) int { return strings.Compare(a.UID, b.UID) })
	var b bytes.Buffer
	for _, r := range sorted {
		line, _ := json.Marshal(r) // plain data: cannot fail
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// DecodeRequests parses what EncodeRequests wrote, rejecting any malformed
// line, invalid request or UID listed twice.
func DecodeRequests(data []byte) ([]Request, error) {
	var requests []Request
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var r Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("requests line %d: %w", n, err)
		}
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("requests line %d: %w", n, err)
		}
		if seen[r.UID] {
			return nil, fmt.Errorf("requests line %d: request %s listed twice", n, r.UID)
		}
		seen[r.UID] = true
		requests = append(requests, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read requests: %w", err)
	}
	return requests, nil
}

// Queued is a request with the time it was made, for Dispatch.
type Queued struct {
	Request
	// Order sorts requests of one user, oldest first (their creation
	// times, then names: both immutable); Dispatch copies it into the
	// requests it lists.
	Order string
}

// Oldest sorts requests oldest first, by Order then UID.
func Oldest(a, b Request) int {
	return cmp.Or(strings.Compare(a.Order, b.Order), strings.Compare(a.UID, b.UID))
}

// Dispatch is what the users Secrets list of queued: per shard, the
// MaxRequestsPerUser oldest requests of each user, oldest first while
// their encoding fits MaxShardRequestsBytes; the others wait their turn.
func Dispatch(queued []Queued) map[int][]Request {
	oldest := func(a, b Queued) int {
		return cmp.Or(strings.Compare(a.Order, b.Order), strings.Compare(a.UID, b.UID))
	}
	byUser := map[string][]Queued{}
	for _, q := range queued {
		byUser[q.User] = append(byUser[q.User], q)
	}
	candidates := map[int][]Queued{}
	for user, qs := range byUser {
		slices.SortFunc(qs, oldest)
		candidates[ShardOf(user)] = append(candidates[ShardOf(user)], qs[:min(len(qs), MaxRequestsPerUser)]...)
	}
	shards := map[int][]Request{}
	for shard, qs := range candidates {
		slices.SortFunc(qs, oldest)
		size := 0
		for _, q := range qs {
			r := q.Request
			r.Order = q.Order
			if size += r.budget(); size > MaxShardRequestsBytes {
				break
			}
			shards[shard] = append(shards[shard], r)
		}
	}
	return shards
}
