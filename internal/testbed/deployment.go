package testbed

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
)

// RunDeployment plays the node and the deployment controller for one
// Deployment: it waits up to timeout for key to exist, runs one pod from its
// template (RunPod, with o's binaries, claims and ports; o.Namespace and
// o.Spec are the Deployment's), waits up to timeout for its readiness
// probes, and then records on the Deployment what the deployment controller
// would (one replica, ready and available), so that `kubectl wait` and
// controllers reading that status see it. tb's cleanup stops the pod.
func RunDeployment(ctx context.Context, tb TB, api *APIServer, key types.NamespacedName, o PodOptions, timeout time.Duration) (*Pod, error) {
	tb.Helper()
	d := &appsv1.Deployment{}
	err := WaitFor(timeout, 100*time.Millisecond, func() (bool, error) {
		return api.Client.Get(ctx, key, d) == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no Deployment %s: %w", key, err)
	}
	o.Namespace, o.Spec, o.API = key.Namespace, d.Spec.Template.Spec, api
	pod := RunPod(tb, o)
	if err := pod.WaitReady(timeout); err != nil {
		return nil, fmt.Errorf("pod of Deployment %s: %w", key, err)
	}
	if err := MarkAvailable(ctx, api, key, timeout); err != nil {
		return nil, err
	}
	return pod, nil
}

// MarkAvailable records on Deployment key what the deployment controller
// would once its one pod is ready: one replica, ready, updated and
// available, and the Available condition.
func MarkAvailable(ctx context.Context, api *APIServer, key types.NamespacedName, timeout time.Duration) error {
	return MarkReplicasAvailable(ctx, api, key, 1, timeout)
}

// MarkReplicasAvailable is MarkAvailable for a Deployment the test bed runs
// n pods of (RunDeployment once for each, then this).
func MarkReplicasAvailable(ctx context.Context, api *APIServer, key types.NamespacedName, n int32, timeout time.Duration) error {
	err := WaitFor(timeout, 100*time.Millisecond, func() (bool, error) {
		cur := &appsv1.Deployment{}
		if err := api.Client.Get(ctx, key, cur); err != nil {
			return false, nil
		}
		cur.Status = appsv1.DeploymentStatus{
			ObservedGeneration: cur.Generation, Replicas: n, ReadyReplicas: n, AvailableReplicas: n, UpdatedReplicas: n,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: "True", Reason: "MinimumReplicasAvailable"}},
		}
		return api.Client.Status().Update(ctx, cur) == nil, nil
	})
	if err != nil {
		return fmt.Errorf("record Deployment %s as available: %w", key, err)
	}
	return nil
}
