package testbed

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Tenant grants user rules in namespace, by a Role and a RoleBinding both
// named user, and returns a client that impersonates user: an attacker
// with only the rights a namespace's admin could hand out, each request
// authorized by the API server.
func (a *APIServer) Tenant(ctx context.Context, namespace, user string, rules ...rbacv1.PolicyRule) (client.Client, error) {
	meta := metav1.ObjectMeta{Name: user, Namespace: namespace}
	if err := a.Client.Create(ctx, &rbacv1.Role{ObjectMeta: meta, Rules: rules}); err != nil {
		return nil, fmt.Errorf("create Role %s/%s: %w", namespace, user, err)
	}
	if err := a.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: meta,
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user}},
	}); err != nil {
		return nil, fmt.Errorf("create RoleBinding %s/%s: %w", namespace, user, err)
	}
	cfg := rest.CopyConfig(a.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: a.Scheme})
	if err != nil {
		return nil, fmt.Errorf("client as %s: %w", user, err)
	}
	return c, nil
}
