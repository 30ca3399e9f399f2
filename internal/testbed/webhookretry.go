package testbed

import (
	"context"
	"fmt"
	"regexp"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubeVirtWebhookCall is how the API server reports that calling one of
// KubeVirt's admission webhooks failed (timed out, or found no virt-api
// endpoint), as opposed to a webhook's answer.
var kubeVirtWebhookCall = regexp.MustCompile(`failed calling webhook "[^"]+\.kubevirt\.io"`)

// KubeVirtWebhookAttempts, KubeVirtWebhookBackoff and KubeVirtWebhookMaxBackoff
// bound RetryKubeVirtWebhooks: at most 8 calls of 10 s (virt-operator's
// webhook timeout) each, the waits between them doubling from 2 s to 30 s,
// about two minutes of waiting in all. A loaded machine first makes the
// webhook time out, then fails virt-api's readiness probe, which takes
// its endpoint away ("no endpoints available") until the probe passes
// again: that takes tens of seconds, not the seconds a fixed short wait
// gives.
const (
	KubeVirtWebhookAttempts   = 8
	KubeVirtWebhookBackoff    = 2 * time.Second
	KubeVirtWebhookMaxBackoff = 30 * time.Second
)

// RetryKubeVirtWebhooks is c, whose writes (create, update, patch) are
// retried while the API server could not call one of KubeVirt's admission
// webhooks. On the cluster backend virt-api runs in a pod with the
// smallest CPU request beside guests under software emulation, and on a
// loaded 2-core machine its webhook answered later than the 10 s the API
// server waits; a user's kubectl would retry the same way. The API server
// stores nothing when admission fails, so a retry never writes twice. A
// webhook's answer (an admission denial), guestbackup's own webhook and any
// other error are returned at once: they are what the tests test. logf,
// when set, says each retry.
func RetryKubeVirtWebhooks(c client.Client, logf func(format string, args ...any)) client.Client {
	return &kubeVirtWebhookRetry{Client: c, backoff: KubeVirtWebhookBackoff, maxBackoff: KubeVirtWebhookMaxBackoff, logf: logf}
}

type kubeVirtWebhookRetry struct {
	client.Client
	// backoff is the first wait, doubled after each retry up to
	// maxBackoff.
	backoff, maxBackoff time.Duration
	logf                func(format string, args ...any)
}

func (c *kubeVirtWebhookRetry) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.retry(ctx, "create", obj, func() error { return c.Client.Create(ctx, obj, opts...) })
}

func (c *kubeVirtWebhookRetry) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.retry(ctx, "update", obj, func() error { return c.Client.Update(ctx, obj, opts...) })
}

func (c *kubeVirtWebhookRetry) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.retry(ctx, "patch", obj, func() error { return c.Client.Patch(ctx, obj, patch, opts...) })
}

// retry calls write until it succeeds, fails otherwise than by a KubeVirt
// webhook call, or KubeVirtWebhookAttempts ran out.
func (c *kubeVirtWebhookRetry) retry(ctx context.Context, verb string, obj client.Object, write func() error) error {
	wait := c.backoff
	for attempt := 1; ; attempt, wait = attempt+1, min(2*wait, max(c.maxBackoff, c.backoff)) {
		err := write()
		if err == nil || !IsKubeVirtWebhookCallFailure(err) {
			return err
		}
		if attempt == KubeVirtWebhookAttempts {
			return fmt.Errorf("%s %s/%s: %d attempts: %w", verb, obj.GetNamespace(), obj.GetName(), attempt, err)
		}
		if c.logf != nil {
			c.logf("%s %s/%s: attempt %d of %d: %v; retrying", verb, obj.GetNamespace(), obj.GetName(), attempt, KubeVirtWebhookAttempts, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s %s/%s: %w (after %v)", verb, obj.GetNamespace(), obj.GetName(), ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// IsKubeVirtWebhookCallFailure tells whether err is the API server's
// report that it could not call one of KubeVirt's admission webhooks.
func IsKubeVirtWebhookCallFailure(err error) bool {
	return apierrors.IsInternalError(err) && kubeVirtWebhookCall.MatchString(err.Error())
}
