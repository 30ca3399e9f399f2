package controller_test

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/guestbackup/guestbackup/internal/controller"
)

// TestSetGCPercent: the controller collects at GCPercent unless GOGC says
// otherwise, which the runtime has read already.
func TestSetGCPercent(t *testing.T) {
	for _, tt := range []struct {
		name string
		gogc *string
		want int
	}{
		{name: "GOGC unset: GCPercent", want: controller.GCPercent},
		{name: "GOGC set: the runtime's own", gogc: new("200"), want: 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GOGC", "") // restores it after
			if tt.gogc == nil {
				os.Unsetenv("GOGC")
			} else {
				os.Setenv("GOGC", *tt.gogc)
			}
			before := debug.SetGCPercent(100)
			defer debug.SetGCPercent(before)
			controller.SetGCPercent()
			if got := debug.SetGCPercent(100); got != tt.want {
				t.Errorf("GC percent %d, want %d", got, tt.want)
			}
		})
	}
}
