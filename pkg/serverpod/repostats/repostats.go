// Package repostats measures a Kopia repository for the server pod's
// /metrics: what the storage holds (stored bytes, blobs), what that data is
// before compression (logical bytes), and how many snapshots each source
// has.
//
// The work is bounded and done on a cadence, never per scrape: Measure lists
// the storage's blobs once (one list request per thousand blobs on S3) and
// walks the content index Kopia already holds in memory; the per-source
// counts come from the snapshot manifests' labels, which Kopia also holds
// in memory (no manifest payload is read). A Collector serves the last
// result to every scrape, so a repository with 10,000 sources costs each
// scrape a copy of 10,000 numbers, and Prometheus scraping every 15 s costs
// the storage nothing.
package repostats

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob"
	"github.com/kopia/kopia/repo/content"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/prometheus/client_golang/prometheus"
)

// Stats is one measurement of a repository.
type Stats struct {
	// StoredBytes is the size of every blob in the storage (packs, indexes,
	// manifests, logs): what the storage bills.
	StoredBytes int64
	// Blobs is how many blobs the storage holds.
	Blobs int64
	// LogicalBytes is the size before compression and encryption of the
	// contents the index lists as live: the deduplicated data the
	// snapshots refer to (or referred to, until maintenance collects it).
	LogicalBytes int64
	// Contents is how many live contents the index lists.
	Contents int64
	// Took is how long Measure took.
	Took time.Duration
	// At is when Measure ended.
	At time.Time
}

// Measure lists the storage's blobs and walks the content index of r.
func Measure(ctx context.Context, r repo.DirectRepository) (Stats, error) {
	start := time.Now()
	var s Stats
	err := r.BlobReader().ListBlobs(ctx, "", func(m blob.Metadata) error {
		s.Blobs++
		s.StoredBytes += m.Length
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("list the storage's blobs: %w", err)
	}
	err = r.ContentReader().IterateContents(ctx, content.IterateOptions{}, func(info content.Info) error {
		s.Contents++
		s.LogicalBytes += int64(info.OriginalLength)
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("walk the content index: %w", err)
	}
	s.At = time.Now()
	s.Took = s.At.Sub(start)
	return s, nil
}

// Source is one snapshot source: a Kopia user (user@host, a guest's
// identity) and the path it snapshots.
type Source struct {
	User, Path string
}

// CountSnapshots counts the snapshots of each source of r, from the labels
// of its snapshot manifests.
func CountSnapshots(ctx context.Context, r repo.Repository) (map[Source]int, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: snapshot.ManifestType})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	counts := make(map[Source]int, len(entries)/4+1)
	for _, e := range entries {
		counts[Source{
			User: e.Labels[snapshot.UsernameLabel] + "@" + e.Labels[snapshot.HostnameLabel],
			Path: e.Labels[snapshot.PathLabel],
		}]++
	}
	return counts, nil
}

// Metric descriptions; names and labels are documented in docs/events.md.
var (
	storedBytesDesc = prometheus.NewDesc("guestbackup_server_repository_stored_bytes",
		"Size of every blob in the repository's storage (what the storage holds), at the last measurement.", nil, nil)
	blobsDesc = prometheus.NewDesc("guestbackup_server_repository_blobs",
		"Blobs in the repository's storage, at the last measurement.", nil, nil)
	logicalBytesDesc = prometheus.NewDesc("guestbackup_server_repository_logical_bytes",
		"Size before compression and encryption of the repository's live contents (deduplicated), at the last measurement.", nil, nil)
	contentsDesc = prometheus.NewDesc("guestbackup_server_repository_contents",
		"Live contents in the repository's index, at the last measurement.", nil, nil)
	measuredDesc = prometheus.NewDesc("guestbackup_server_repository_measured_timestamp_seconds",
		"When the repository was last measured (Unix time).", nil, nil)
	measureSecondsDesc = prometheus.NewDesc("guestbackup_server_repository_measure_seconds",
		"How long the last measurement of the repository took.", nil, nil)
	sourceSnapshotsDesc = prometheus.NewDesc("guestbackup_server_source_snapshots",
		"Snapshots a source (a guest's user and one of its paths) has in the repository.", []string{"user", "path"}, nil)
)

// Collector serves the last Stats and snapshot counts it was given: a
// scrape reads memory only. Its zero value serves nothing until Set.
type Collector struct {
	mu      sync.Mutex
	stats   *Stats
	sources map[Source]int
}

var _ prometheus.Collector = (*Collector)(nil)

// SetStats replaces the repository's measurement.
func (c *Collector) SetStats(s Stats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats = &s
}

// SetSources replaces the snapshot counts per source; the Collector keeps
// the map, which the caller must not change after.
func (c *Collector) SetSources(counts map[Source]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = counts
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{storedBytesDesc, blobsDesc, logicalBytesDesc, contentsDesc, measuredDesc, measureSecondsDesc, sourceSnapshotsDesc} {
		ch <- d
	}
}

// Collect sends the last values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats, sources := c.stats, c.sources
	c.mu.Unlock()
	if stats != nil {
		gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
		gauge(storedBytesDesc, float64(stats.StoredBytes))
		gauge(blobsDesc, float64(stats.Blobs))
		gauge(logicalBytesDesc, float64(stats.LogicalBytes))
		gauge(contentsDesc, float64(stats.Contents))
		gauge(measuredDesc, float64(stats.At.Unix()))
		gauge(measureSecondsDesc, stats.Took.Seconds())
	}
	for s, n := range sources {
		ch <- prometheus.MustNewConstMetric(sourceSnapshotsDesc, prometheus.GaugeValue, float64(n), s.User, s.Path)
	}
}
