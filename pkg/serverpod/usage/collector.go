package usage

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// storedBytesDesc is the one metric of a Collector.
var storedBytesDesc = prometheus.NewDesc("guestbackup_server_user_stored_bytes",
	"Bytes the repository's storage holds for a guest's user: the packed size of the distinct contents its snapshots reference, deduplicated within the user and not across users, at the last measurement.",
	[]string{"user"}, nil)

// Collector serves the last usage it was given: a scrape reads memory
// only, never the repository. Its zero value serves nothing until Set, as
// no figure is better than a false 0.
type Collector struct {
	mu    sync.Mutex
	usage map[string]int64
}

var _ prometheus.Collector = (*Collector)(nil)

// Set replaces the usage served, one series per user; the Collector keeps
// the map, which the caller must not change after. A user absent from it
// (its snapshots all gone) is no longer served.
func (c *Collector) Set(usage map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.usage = usage
}

// Describe sends the metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- storedBytesDesc
}

// Collect sends the last usage of each user.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	usage := c.usage
	c.mu.Unlock()
	for user, n := range usage {
		ch <- prometheus.MustNewConstMetric(storedBytesDesc, prometheus.GaugeValue, float64(n), user)
	}
}
