package cluster

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/guestbackup/guestbackup/test/story"
)

// The zero-touch story (test/story's specs), as test/kubevirt runs it on the
// local bed, here on real KubeVirt, with the specs whose Jobs only a real
// node runs (story.WithJobs).
var _ = Describe("Zero touch on real KubeVirt: an opted-in VM's guest backs itself up", Ordered, func() {
	story.ZeroTouch(func(ctx context.Context, bslsNS string, namespaces ...string) story.Bed {
		return startClusterBed(ctx, bslsNS, namespaces...)
	}, story.WithJobs)
})
