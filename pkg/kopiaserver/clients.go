package kopiaserver

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientsecret"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// The BSLS reconciler provisions BackupClients' users too (docs/design.md,
// decision 25).
// +kubebuilder:rbac:groups=guestbackup.io,resources=backupclients,verbs=get;list;watch

// ClientInputs is everything CollectClients decides from.
type ClientInputs struct {
	// Server is the BSLS whose users are collected.
	Server types.NamespacedName
	// Clients are the BackupClients of the cluster (those naming another
	// server are skipped).
	Clients []v1alpha1.BackupClient
	// Secrets are the clients' Secrets, by namespace and name.
	Secrets map[types.NamespacedName]*corev1.Secret
	// Allowed is whether a namespace may use Server.
	Allowed func(namespace string) bool
}

// CollectClients adds to set the users of the BackupClients that name
// Server. Identity comes from facts, never from data (decisions 10 and 25):
// a client's user is identity.OfClient of the BackupClient itself, which
// can never be a VM's, and it is provisioned only while the client exists
// (not being deleted), its namespace may use Server (Server's own always
// may: its admin is the server's), and its Secret is controlled by that
// very client (its UID) and holds a hash. A client the server does not
// admit gets no user: its own Ready condition says why, and its reconciler
// issues it no credentials. Nor does a client with a password of its
// admin's own (spec.passwordHash) outside Server's namespace: only the
// server's admin declares those.
func CollectClients(set *UserSet, in ClientInputs) {
	for i := range in.Clients {
		c := &in.Clients[i]
		if !mayUse(c, in.Server, in.Allowed) {
			continue
		}
		username := identity.OfClient(c.Name, c.Namespace)
		if err := identity.ValidateUsername(username); err != nil {
			continue // the API server admits no such name; a user name it is not
		}
		key := types.NamespacedName{Namespace: c.Namespace, Name: clientsecret.Name(c)}
		s := in.Secrets[key]
		h := (*identity.Hash)(nil)
		if s != nil && clientsecret.IsOf(s, c) {
			h = clientsecret.Hash(s)
		}
		if h == nil {
			set.Pending = append(set.Pending, key.String())
			continue
		}
		set.Shards[userset.ShardOf(username)][username] = *h
		set.Count++
	}
	slices.Sort(set.Pending)
}

// mayUse is whether BackupClient c may have a user on server: it names
// server and is not being deleted; its namespace may use server (server's
// own always may: its admin is the server's); and it has a password of its
// admin's own (spec.passwordHash) only in server's namespace.
func mayUse(c *v1alpha1.BackupClient, server types.NamespacedName, allowed func(namespace string) bool) bool {
	own := c.Namespace == server.Namespace
	return c.Spec.Server == v1alpha1.ServerReference{Namespace: server.Namespace, Name: server.Name} &&
		c.DeletionTimestamp.IsZero() && (own || allowed(c.Namespace) && c.Spec.PasswordHash == nil)
}

// clientsOf reads, from the cache, the BackupClients that name server
// (and no other) and the Secrets their credentials go to.
func (r *Reconciler) clientsOf(ctx context.Context, server types.NamespacedName) ([]v1alpha1.BackupClient, map[types.NamespacedName]*corev1.Secret, error) {
	list := &v1alpha1.BackupClientList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, nil, fmt.Errorf("list BackupClients: %w", err)
	}
	secrets := map[types.NamespacedName]*corev1.Secret{}
	list.Items = slices.DeleteFunc(list.Items, func(c v1alpha1.BackupClient) bool {
		return c.Spec.Server != (v1alpha1.ServerReference{Namespace: server.Namespace, Name: server.Name})
	})
	for i := range list.Items {
		c := &list.Items[i]
		key := types.NamespacedName{Namespace: c.Namespace, Name: clientsecret.Name(c)}
		s := &corev1.Secret{}
		switch err := r.Client.Get(ctx, key, s); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("get Secret %s of BackupClient %s/%s: %w", key, c.Namespace, c.Name, err)
		}
		secrets[key] = s
	}
	return list.Items, secrets, nil
}

// bslsOfClient maps a BackupClient to the BSLS it names.
func bslsOfClient(_ context.Context, o client.Object) []reconcile.Request {
	c, ok := o.(*v1alpha1.BackupClient)
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.Spec.Server.Namespace, Name: c.Spec.Server.Name}}}
}

// bslsOfClientSecret maps a client's Secret to the BSLS its client names.
func (r *Reconciler) bslsOfClientSecret(ctx context.Context, s client.Object, name string) []reconcile.Request {
	c := &v1alpha1.BackupClient{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: s.GetNamespace(), Name: name}, c); err != nil {
		if !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Error(err, "get the BackupClient of a Secret", "secret", client.ObjectKeyFromObject(s))
		}
		return nil
	}
	return bslsOfClient(ctx, c)
}
