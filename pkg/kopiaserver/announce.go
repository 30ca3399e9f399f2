package kopiaserver

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Reannounce is how long a refusal still in force goes unannounced: the
// API server's default --event-ttl, after which the Event that announced
// it is gone and an admin reading Events would find the condition's count
// of refusals with nothing naming them.
const Reannounce = time.Hour

// announcements remembers, per BSLS, the refusal last announced for each
// key and when, so that a reconcile records an Event for a refusal that
// is new, changed, or older than Reannounce, not at every pass. Every Event
// spends the recorder's spam budget for its object (client-go lets a burst
// of 25 through, then one every 5 minutes): repeats on every reconcile,
// more frequent the busier the controller, spent it on news the admin
// already had, and the next refusal was dropped without a trace.
type announcements[K comparable] struct {
	mu   sync.Mutex
	last map[types.NamespacedName]map[K]announced
}

// announced is one refusal's message and when it was last announced.
type announced struct {
	message string
	at      time.Time
}

// news returns, sorted by their text, the keys of refused to announce
// now, and remembers refused as what is in force for server: a refusal
// mended and later made anew is announced again.
func (a *announcements[K]) news(c clock.PassiveClock, server types.NamespacedName, refused map[K]string) []K {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[types.NamespacedName]map[K]announced{}
	}
	before := a.last[server]
	now := make(map[K]announced, len(refused))
	var out []K
	for k, message := range refused {
		prev, ok := before[k]
		if !ok || prev.message != message || c.Since(prev.at) >= Reannounce {
			out = append(out, k)
			prev = announced{message: message, at: c.Now()}
		}
		now[k] = prev
	}
	if len(now) == 0 {
		delete(a.last, server)
	} else {
		a.last[server] = now
	}
	slices.SortFunc(out, func(x, y K) int { return strings.Compare(fmt.Sprint(x), fmt.Sprint(y)) })
	return out
}

// forget drops what was announced for server.
func (a *announcements[K]) forget(server types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.last, server)
}
