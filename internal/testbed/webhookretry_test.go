package testbed

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// callFailure is the API server's error when it cannot call webhook.
func callFailure(webhook string) error {
	return apierrors.NewInternalError(fmt.Errorf("failed calling webhook %q: failed to call webhook: Post \"https://virt-api.kubevirt.svc:443/\": context deadline exceeded", webhook))
}

func TestIsKubeVirtWebhookCallFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"KubeVirt's mutating webhook timed out", callFailure("virtualmachines-mutator.kubevirt.io"), true},
		{"KubeVirt's validating webhook timed out", callFailure("virtualmachine-validator.kubevirt.io"), true},
		{"guestbackup's own webhook timed out", callFailure("virtualmachines.guestbackup.io"), false},
		{"a name that only ends like KubeVirt's", callFailure("evil.kubevirt.io.example"), false},
		{"KubeVirt's webhook denied the request", apierrors.NewForbidden(schema.GroupResource{Group: "kubevirt.io", Resource: "virtualmachines"}, "vm",
			errors.New(`admission webhook "virtualmachine-validator.kubevirt.io" denied the request`)), false},
		{"another internal error", apierrors.NewInternalError(errors.New("etcdserver: request timed out")), false},
		{"no error", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsKubeVirtWebhookCallFailure(tc.err); got != tc.want {
				t.Errorf("IsKubeVirtWebhookCallFailure(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestRetryKubeVirtWebhooks(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failures  []error // the first creates' errors, in order
		wantCalls int
		wantErr   bool
	}{
		{"stores at once when the webhook answers", nil, 1, false},
		{"retries a timed-out KubeVirt webhook until it answers", []error{callFailure("virtualmachines-mutator.kubevirt.io"), callFailure("virtualmachines-mutator.kubevirt.io")}, 3, false},
		{"waits out virt-api's lost endpoint", []error{
			callFailure("virtualmachines-mutator.kubevirt.io"), callFailure("virtualmachines-mutator.kubevirt.io"),
			callFailure("virtualmachines-mutator.kubevirt.io"), callFailure("virtualmachines-mutator.kubevirt.io"),
			callFailure("virtualmachines-mutator.kubevirt.io"),
		}, 6, false},
		{"gives up after its attempts", func() []error {
			var errs []error
			for range KubeVirtWebhookAttempts {
				errs = append(errs, callFailure("virtualmachines-mutator.kubevirt.io"))
			}
			return errs
		}(), KubeVirtWebhookAttempts, true},
		{"never retries guestbackup's webhook", []error{callFailure("virtualmachines.guestbackup.io")}, 1, true},
		{"never retries a denial", []error{apierrors.NewBadRequest("admission webhook denied the request")}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			inner := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					calls++
					if calls <= len(tc.failures) {
						return tc.failures[calls-1]
					}
					return c.Create(ctx, obj, opts...)
				},
			}).Build()
			var retries int
			c := &kubeVirtWebhookRetry{Client: inner, backoff: time.Millisecond, maxBackoff: 4 * time.Millisecond, logf: func(string, ...any) { retries++ }}
			err := c.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "x"}})
			if (err != nil) != tc.wantErr {
				t.Fatalf("Create: %v, want error %v", err, tc.wantErr)
			}
			if calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", calls, tc.wantCalls)
			}
			stored := inner.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: "x"}, &corev1.ConfigMap{}) == nil
			if stored == tc.wantErr {
				t.Errorf("stored %v after error %v", stored, err)
			}
			if retries != calls-1 {
				t.Errorf("%d retries said for %d calls", retries, calls)
			}
		})
	}
}
