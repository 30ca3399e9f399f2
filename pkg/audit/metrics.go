package audit

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/guestbackup/guestbackup/pkg/activity"
)

// The series the audit exports of every opted-in VM, labelled namespace,
// vm and bsls.
var (
	lastSnapshotTimeDesc = prometheus.NewDesc("guestbackup_vm_last_snapshot_timestamp_seconds",
		"When a VM's newest snapshot ended (Unix time).", vmLabels, nil)
	lastSnapshotBytesDesc = prometheus.NewDesc("guestbackup_vm_last_snapshot_bytes",
		"Size of the files in a VM's newest snapshot.", vmLabels, nil)
	snapshotsDesc = prometheus.NewDesc("guestbackup_vm_snapshots",
		"Snapshots a VM has in its server's repository.", vmLabels, nil)
	guestNotConnectedDesc = prometheus.NewDesc("guestbackup_vm_guest_not_connected",
		"1 while a running VM's guest has not connected within the controller's --guest-not-connected-after of its start (the GuestNotConnected Event), else 0.", vmLabels, nil)
	vmLabels = []string{"namespace", "vm", "bsls"}
)

// exported holds the series of every VM the audit reconciled, and makes
// them as they are scraped. A GaugeVec would keep each series as a metric
// of its own, with its labels paired and hashed: four per VM, 17 MB or
// 15 % of the controller's heap with 10,000 VMs (BenchmarkOptedInVMs);
// here a VM costs one map entry.
var exported = &vmSeries{vms: map[types.NamespacedName]guestSeries{}}

func init() {
	metrics.Registry.MustRegister(exported)
}

// guestSeries is what is exported of one VM's guest.
type guestSeries struct {
	bsls         string
	notConnected bool
	// guest: its server published activity for it (snapshots); last: of
	// a snapshot (lastEnd, lastBytes).
	guest, last bool
	snapshots   int
	lastEnd     int64
	lastBytes   int64
}

// vmSeries is a prometheus.Collector of every VM's guestSeries.
type vmSeries struct {
	mu  sync.RWMutex
	vms map[types.NamespacedName]guestSeries
}

// set exports what is known of vm's guest on bsls. What the server no
// longer publishes keeps its last value, as an alert on an ever older
// snapshot needs; a VM that moved to another server starts afresh, since
// the alerts match every series of a VM and one kept for the server it
// left would fire for as long as the controller runs.
func (s *vmSeries) set(vm types.NamespacedName, bsls string, notConnected bool, guest *activity.Guest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.vms[vm]
	if g.bsls != bsls {
		g = guestSeries{bsls: bsls}
	}
	g.notConnected = notConnected
	if guest != nil {
		g.guest, g.snapshots = true, guest.Snapshots
		if guest.Last.ID != "" {
			g.last, g.lastEnd, g.lastBytes = true, guest.Last.End.Unix(), guest.Last.Bytes
		}
	}
	s.vms[vm] = g
}

// forget stops exporting vm's series.
func (s *vmSeries) forget(vm types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.vms, vm)
}

// Describe implements prometheus.Collector.
func (s *vmSeries) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{lastSnapshotTimeDesc, lastSnapshotBytesDesc, snapshotsDesc, guestNotConnectedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It sends from a copy, so that
// no reconcile waits while a scrape encodes every VM's series.
func (s *vmSeries) Collect(ch chan<- prometheus.Metric) {
	type entry struct {
		vm types.NamespacedName
		g  guestSeries
	}
	s.mu.RLock()
	entries := make([]entry, 0, len(s.vms))
	for vm, g := range s.vms {
		entries = append(entries, entry{vm, g})
	}
	s.mu.RUnlock()
	for _, e := range entries {
		g := e.g
		labels := []string{e.vm.Namespace, e.vm.Name, g.bsls}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		notConnected := 0.0
		if g.notConnected {
			notConnected = 1
		}
		gauge(guestNotConnectedDesc, notConnected)
		if g.guest {
			gauge(snapshotsDesc, float64(g.snapshots))
		}
		if g.last {
			gauge(lastSnapshotTimeDesc, float64(g.lastEnd))
			gauge(lastSnapshotBytesDesc, float64(g.lastBytes))
		}
	}
}
