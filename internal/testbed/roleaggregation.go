package testbed

import (
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// roleAggregationController is kube-controller-manager's controller that
// adds the rules of every ClusterRole labelled
// rbac.authorization.k8s.io/aggregate-to-<role>: "true" to the ClusterRoles
// whose aggregationRule selects that label: the built-in admin, edit and
// view among them.
const roleAggregationController = "clusterrole-aggregation-controller"

// StartRoleAggregation runs kube-controller-manager with its ClusterRole
// aggregation controller alone against api, as every cluster's control
// plane does; envtest runs no controller manager, so without it a
// ClusterRole aggregated to edit grants nothing to a namespace's editors.
// It acts as that controller's ServiceAccount user, its identity on a
// kubeadm cluster (--use-service-account-credentials), so it holds only
// the bootstrap role the API server gives that controller. It needs the
// "node" tools. tb's cleanup stops it.
func StartRoleAggregation(tb TB, api *APIServer) {
	tb.Helper()
	tools, err := LoadTools()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	if tools.KubeControllerManager == "" {
		tb.Fatalf("kube-controller-manager is not built: list the package's tools with \"node\" in hack/test-tools.txt")
	}
	user, err := api.Env.AddUser(envtest.User{Name: "system:serviceaccount:kube-system:" + roleAggregationController}, nil)
	if err != nil {
		tb.Fatalf("user for %s: %v", roleAggregationController, err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		tb.Fatalf("kubeconfig for %s: %v", roleAggregationController, err)
	}
	dir := tb.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
		tb.Fatalf("%v", err)
	}
	StartProcess(tb, ProcessSpec{Name: "kube-controller-manager", Path: tools.KubeControllerManager, Dir: dir, Args: []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
		"--controllers=" + roleAggregationController,
	}})
}
