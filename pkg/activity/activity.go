// Package activity is what a Kopia server has seen its guests do, and how
// that reaches the controller: the server pod's user-sync container scans
// the repository's snapshot manifests (package activityscan) and writes, per
// guest, how many snapshots it has and its latest one into "activity
// ConfigMaps" in the BSLS's namespace (no secret in them); the controller
// turns changes into Events and metrics on the VMs. This package is the
// format of those ConfigMaps, shared by both sides: the repository never
// leaves the server pod, and the controller links no Kopia.
package activity

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
)

const (
	// Key is the data key of an activity ConfigMap.
	Key = "activity"
	// Label marks an activity ConfigMap with the name of its BSLS.
	Label = "guestbackup.io/activity-of"
)

// ConfigMapName is a BSLS's activity ConfigMap of one shard; guests are
// sharded as their users are (userset.ShardOf).
func ConfigMapName(bslsName string, shard int) string {
	return fmt.Sprintf("%s-activity-%d", bslsName, shard)
}

// Snapshot is one snapshot, as much of it as an admin audits. In a
// restore's result it is what one path is restored from: Path is the path
// restored, Root the snapshot's source path that holds it, and Bytes and
// Files what lies at Path in the snapshot.
type Snapshot struct {
	ID    string    `json:"id"`
	Path  string    `json:"path"`
	Root  string    `json:"root,omitempty"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Bytes int64     `json:"bytes"`
	Files int32     `json:"files"`
}

// Guest is the activity of one Kopia user (a VM).
type Guest struct {
	User string `json:"user"`
	// Snapshots is how many snapshots the user has in the repository.
	Snapshots int `json:"snapshots"`
	// First is when the first snapshot seen was written.
	First time.Time `json:"first"`
	// Last is the newest snapshot.
	Last Snapshot `json:"last"`
	// Report is the last problem the guest reported about its kopia
	// client (package clientdist), authenticated as User; nil for none.
	Report *Report `json:"report,omitempty"`
	// Results are what the guest answered to the requests the users
	// Secrets list for it (userset.RequestsKey), sorted by UID; a result
	// goes when its request leaves the list.
	Results []Result `json:"results,omitempty"`
}

// Result is where a guest is with one request, as its server pod verified
// it: the snapshots are those the repository holds under the guest's own
// identity with the request's tag (userset.RequestTag), whatever the guest
// claimed.
type Result struct {
	// UID is the request's.
	UID string `json:"uid"`
	// Phase is Running, Succeeded or Failed (v1alpha1.RequestPhase).
	Phase string `json:"phase"`
	// Message is the guest's own words, printable and bounded; on failure,
	// why.
	Message string `json:"message,omitempty"`
	// Snapshots are the request's snapshots in the repository: of a
	// snapshot request, those taken; of a restore, those its paths are
	// restored from, chosen when the guest started it.
	Snapshots []Snapshot `json:"snapshots,omitempty"`
	// Listing is what a restore's dry run would write, as its server pod
	// listed it from the repository; nil for anything else.
	Listing *Listing `json:"listing,omitempty"`
	// History is, for a history's dry run, its path's versions, newest
	// first, as its server pod listed them from the repository.
	History []Version `json:"history,omitempty"`
	// Restored is, of a running restore, how many of Snapshots (its plan,
	// in order) its carrier said it has restored: what it wrote so far is
	// what they hold.
	Restored int `json:"restored,omitempty"`
	// Started is when the guest said it started; Ended when it said it
	// ended (both as its server pod received them).
	Started time.Time  `json:"started"`
	Ended   *time.Time `json:"ended,omitempty"`
}

// Listing is what a restore would write: its first entries, in path order
// (at most userset.MaxListingEntries and MaxListingBytes of them), and the
// count and size of all its files.
type Listing struct {
	Entries   []Entry `json:"entries,omitempty"`
	Files     int64   `json:"files"`
	Bytes     int64   `json:"bytes"`
	Truncated bool    `json:"truncated,omitempty"`
}

// Entry is one file, folder or symbolic link a restore would write.
type Entry struct {
	// Path is where it would be written in the guest.
	Path string `json:"path"`
	// Type is file, directory or symlink.
	Type string `json:"type"`
	// Size is a file's size, or a folder's files'.
	Size    int64     `json:"size"`
	ModTime time.Time `json:"modTime"`
}

// Version is a path as one snapshot holds it.
type Version struct {
	// ID and Start are the snapshot's.
	ID    string    `json:"id"`
	Start time.Time `json:"start"`
	// Type is file, directory or symlink.
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	ModTime time.Time `json:"modTime"`
	// Changed: its content differs from the next older version listed;
	// true for the oldest listed.
	Changed bool `json:"changed,omitempty"`
}

// Report is a problem a guest reported to its server pod.
type Report struct {
	// Kind is one of clientdist.ReportKinds.
	Kind string `json:"kind"`
	// Message is the guest's own words, printable and bounded.
	Message string `json:"message"`
	// At is when the server pod received it.
	At time.Time `json:"at"`
}

// Encode renders guests as JSON lines sorted by user, so unchanged
// activity gives an unchanged ConfigMap.
func Encode(guests map[string]Guest) []byte { return encodeLines(guests) }

// Decode parses what Encode wrote.
func Decode(data []byte) (map[string]Guest, error) {
	return decodeLines(data, "activity", func(g Guest) string { return g.User })
}

// encodeLines renders values as JSON lines sorted by key.
func encodeLines[T any](values map[string]T) []byte {
	var b bytes.Buffer
	for _, key := range slices.Sorted(maps.Keys(values)) {
		line, _ := json.Marshal(values[key]) // plain data: cannot fail
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// decodeLines parses JSON lines of what, each keyed by key.
func decodeLines[T any](data []byte, what string, key func(T) string) (map[string]T, error) {
	values := map[string]T{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", what, n, err)
		}
		values[key(v)] = v
	}
	return values, sc.Err()
}
