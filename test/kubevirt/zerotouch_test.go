package kubevirt

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/guestbackup/guestbackup/test/story"
)

// The zero-touch story (test/story's seven specs) on the local bed;
// test/cluster runs the same specs on real KubeVirt.
var _ = Describe("Zero touch: an opted-in VM's guest backs itself up", Ordered, func() {
	story.ZeroTouch(func(ctx context.Context, bslsNS string, namespaces ...string) story.Bed {
		return startLocalBed(ctx, bslsNS, namespaces...)
	})
})
