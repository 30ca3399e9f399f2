package activity

import (
	"cmp"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// A guest's catalogue is its newest snapshots, which its owner lists from
// the cluster (GuestProtection status.recentSnapshots). The server pod
// publishes the catalogues of its guests into "catalogue ConfigMaps",
// apart from the activity ConfigMaps: at 10,000 guests they hold about
// 13 MB, more than the 16 activity shards leave room for beside the
// requests' results, so they have shards of their own.
const (
	// CatalogueKey is the data key of a catalogue ConfigMap.
	CatalogueKey = "catalogue"
	// CatalogueShards is how many catalogue ConfigMaps a BSLS has: at
	// 10,000 guests, each holds about 313 catalogues (365 in an unlucky
	// shard) of at most MaxCatalogueBytes, 821 KiB at worst, under the
	// 1 MiB a ConfigMap may hold. Ten snapshots of a short path take about
	// 1.6 KB.
	CatalogueShards = 32
	// MaxCatalogueBytes bounds one guest's catalogue, encoded: ten
	// snapshots of a 40-byte path by a VM whose names take 127 bytes fit,
	// and a guest decides its snapshots' paths: long ones cost it
	// snapshots in its catalogue, never room in the others'.
	MaxCatalogueBytes = 2304
)

// CatalogueConfigMapName is a BSLS's catalogue ConfigMap of one shard.
func CatalogueConfigMapName(bslsName string, shard int) string {
	return fmt.Sprintf("%s-catalogue-%d", bslsName, shard)
}

// CatalogueShardOf is the catalogue shard of a Kopia user.
func CatalogueShardOf(user string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(user)) // never fails
	return int(h.Sum32() % CatalogueShards)
}

// catalogueLine is one guest's catalogue in a catalogue ConfigMap.
type catalogueLine struct {
	User      string     `json:"user"`
	Snapshots []Snapshot `json:"snapshots"`
}

// Newest is the catalogue of snapshots: newest first (by end time, then
// ID), at most v1alpha1.MaxRecentSnapshots of them, and no more than fit
// in MaxCatalogueBytes with user's name. It stops at the first that does
// not fit, so that what it lists is always the newest ones. Times are kept
// to the second, as the API server keeps them.
func Newest(user string, snapshots []Snapshot) []Snapshot {
	sorted := slices.Clone(snapshots)
	slices.SortFunc(sorted, func(a, b Snapshot) int {
		return cmp.Or(b.End.Compare(a.End), strings.Compare(b.ID, a.ID))
	})
	out := []Snapshot{}
	size := len(user) + len(`{"user":"","snapshots":[]}`)
	for _, s := range sorted[:min(len(sorted), v1alpha1.MaxRecentSnapshots)] {
		s.Root = ""
		s.Start, s.End = s.Start.UTC().Truncate(1e9), s.End.UTC().Truncate(1e9)
		line, _ := json.Marshal(s) // plain data: cannot fail
		if size+len(line)+1 > MaxCatalogueBytes {
			break
		}
		size += len(line) + 1
		out = append(out, s)
	}
	return out
}

// MaxCatalogueShardBytes bounds a catalogue ConfigMap's content, under
// the 1 MiB a ConfigMap may hold: a shard that holds more guests than
// CatalogueShards plans for (tenants may name their VMs into one) lists
// fewer snapshots of each, never none of some.
const MaxCatalogueShardBytes = 900 << 10

// FitCatalogues is EncodeCatalogues of catalogues, each cut to its newest
// snapshots as far as the shard needs to fit MaxCatalogueShardBytes (one
// each at least); a shard of so many guests that one each does not fit
// is left to the API server to refuse.
func FitCatalogues(catalogues map[string][]Snapshot) []byte {
	data := EncodeCatalogues(catalogues)
	for keep := v1alpha1.MaxRecentSnapshots - 1; len(data) > MaxCatalogueShardBytes && keep >= 1; keep-- {
		cut := make(map[string][]Snapshot, len(catalogues))
		for user, snaps := range catalogues {
			cut[user] = snaps[:min(len(snaps), keep)]
		}
		data = EncodeCatalogues(cut)
	}
	return data
}

// EncodeCatalogues renders the catalogues of guests, by user, as JSON
// lines sorted by user, so unchanged catalogues give an unchanged
// ConfigMap.
func EncodeCatalogues(catalogues map[string][]Snapshot) []byte {
	lines := map[string]catalogueLine{}
	for user, snapshots := range catalogues {
		lines[user] = catalogueLine{User: user, Snapshots: snapshots}
	}
	return encodeLines(lines)
}

// CatalogueIndex finds each guest's catalogue in what EncodeCatalogues
// wrote, without keeping it decoded: the controller's cache holds the
// ConfigMap's data already, and 10,000 catalogues decoded would take some
// 30 MB more of its memory; one is decoded when it is read.
type CatalogueIndex struct {
	data string
	at   map[string][2]int
}

// IndexCatalogues indexes data, which EncodeCatalogues wrote; the index
// keeps data.
func IndexCatalogues(data string) (*CatalogueIndex, error) {
	x := &CatalogueIndex{data: data, at: map[string][2]int{}}
	for start, n := 0, 1; start < len(data); n++ {
		end := strings.IndexByte(data[start:], '\n')
		if end < 0 {
			end = len(data) - start
		}
		line := data[start : start+end]
		if strings.TrimSpace(line) != "" {
			var head struct {
				User string `json:"user"`
			}
			if err := json.Unmarshal([]byte(line), &head); err != nil {
				return nil, fmt.Errorf("catalogue line %d: %w", n, err)
			}
			x.at[head.User] = [2]int{start, start + end}
		}
		start += end + 1
	}
	return x, nil
}

// Users are the users the index holds a catalogue of.
func (x *CatalogueIndex) Users() []string {
	if x == nil {
		return nil
	}
	return slices.Collect(maps.Keys(x.at))
}

// Of decodes user's catalogue; nil when the index holds none.
func (x *CatalogueIndex) Of(user string) ([]Snapshot, error) {
	if x == nil {
		return nil, nil
	}
	at, ok := x.at[user]
	if !ok {
		return nil, nil
	}
	var l catalogueLine
	if err := json.Unmarshal([]byte(x.data[at[0]:at[1]]), &l); err != nil {
		return nil, fmt.Errorf("catalogue of %s: %w", user, err)
	}
	return l.Snapshots, nil
}

// DecodeCatalogues parses what EncodeCatalogues wrote.
func DecodeCatalogues(data []byte) (map[string][]Snapshot, error) {
	lines, err := decodeLines(data, "catalogue", func(l catalogueLine) string { return l.User })
	if err != nil {
		return nil, err
	}
	out := make(map[string][]Snapshot, len(lines))
	for user, l := range lines {
		out[user] = l.Snapshots
	}
	return out, nil
}
