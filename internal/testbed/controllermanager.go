package testbed

import (
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Controllers of kube-controller-manager that StartControllerManager runs.
const (
	// RoleAggregationController adds the rules of every ClusterRole
	// labelled rbac.authorization.k8s.io/aggregate-to-<role>: "true" to
	// the ClusterRoles whose aggregationRule selects that label: the
	// built-in admin, edit and view among them.
	RoleAggregationController = "clusterrole-aggregation-controller"
	// PolicyStatusController type-checks each ValidatingAdmissionPolicy's
	// expressions against the types it matches, into its
	// status.typeChecking.
	PolicyStatusController = "validatingadmissionpolicy-status-controller"
)

// StartControllerManager runs kube-controller-manager with only the named
// controllers against api, as every cluster's control plane runs them:
// envtest runs no controller manager, so without it a ClusterRole
// aggregated to edit grants nothing to a namespace's editors, and no
// admission policy is type-checked. Each controller acts as its own
// ServiceAccount (--use-service-account-credentials, as kubeadm sets it),
// so it holds only the bootstrap role the API server gives it. It needs
// the "node" tools. tb's cleanup stops it.
func StartControllerManager(tb TB, api *APIServer, controllers ...string) {
	tb.Helper()
	tools, err := LoadTools()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	if tools.KubeControllerManager == "" {
		tb.Fatalf("kube-controller-manager is not built: list the package's tools with \"node\" in hack/test-tools.txt")
	}
	user, err := api.Env.AddUser(envtest.User{Name: "system:kube-controller-manager"}, nil)
	if err != nil {
		tb.Fatalf("user for kube-controller-manager: %v", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		tb.Fatalf("kubeconfig for kube-controller-manager: %v", err)
	}
	dir := tb.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
		tb.Fatalf("%v", err)
	}
	StartProcess(tb, ProcessSpec{Name: "kube-controller-manager", Path: tools.KubeControllerManager, Dir: dir, Args: []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
		"--use-service-account-credentials=true",
		"--controllers=" + strings.Join(controllers, ","),
	}})
}
