package manager

import (
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
)

// TestControllersWaitLongerForTheirCaches: a binary's controllers wait
// CacheSyncTimeout for their first lists, not controller-runtime's 2
// minutes, unless the binary asks for another time.
func TestControllersWaitLongerForTheirCaches(t *testing.T) {
	if got := withCacheSyncTimeout(ctrl.Options{}).Controller.CacheSyncTimeout; got != CacheSyncTimeout {
		t.Errorf("cache sync timeout %v, want %v", got, CacheSyncTimeout)
	}
	asked := ctrl.Options{Controller: config.Controller{CacheSyncTimeout: time.Minute}}
	if got := withCacheSyncTimeout(asked).Controller.CacheSyncTimeout; got != time.Minute {
		t.Errorf("cache sync timeout %v, want the minute asked for", got)
	}
}
