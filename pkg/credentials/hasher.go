// Package credentials reconciles the per-VM credential Secrets the webhook
// writes (see DESIGN.md, "the per-VM Secret"): the controller's side of that
// contract.
package credentials

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The hasher reads credential Secrets from the cache and patches in the hash.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;patch

// Hasher hashes each per-VM password once per generation, the way Kopia
// stores it, and keeps the hash in the Secret: the BSLS's user sync reads
// hashes only, so a resync never hashes again (hashing is slow by design).
type Hasher struct {
	Client client.Client
	// Version is the hashing algorithm; default scrypt, Kopia's default.
	Version identity.HashVersion
}

// SetupWithManager registers the Hasher; hashes run in parallel, one per core.
func (h *Hasher) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	sel := vmsecret.Selector()
	return ctrl.NewControllerManagedBy(mgr).
		Named("credential-hasher").
		For(&corev1.Secret{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return sel.Matches(labels.Set(o.GetLabels()))
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(concurrency, 1)}).
		Complete(h)
}

// Reconcile hashes one Secret's password when its hash is missing or stale.
func (h *Hasher) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	secret := &corev1.Secret{}
	if err := h.Client.Get(ctx, req.NamespacedName, secret); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if HashFor(secret) != nil {
		return ctrl.Result{}, nil
	}
	password := vmsecret.Password(secret)
	if password == "" {
		// The webhook always writes one; nothing to hash until it does.
		log.FromContext(ctx).Info("credential Secret has no password", "secret", req.NamespacedName)
		return ctrl.Result{}, nil
	}
	version := h.Version
	if version == 0 {
		version = identity.Scrypt
	}
	hash, err := identity.NewHash(password, version)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("hash password of %s: %w", req.NamespacedName, err)
	}
	// The patch carries the resourceVersion: a password rotated since the
	// read makes it conflict instead of storing a stale hash.
	patch := client.MergeFromWithOptions(secret.DeepCopy(), client.MergeFromWithOptimisticLock{})
	vmsecret.SetPasswordHash(secret, hash.String())
	if err := h.Client.Patch(ctx, secret, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("store password hash of %s: %w", req.NamespacedName, err)
	}
	return ctrl.Result{}, nil
}

// HashFor returns the hash a credential Secret holds for its current
// password generation, or nil when it has none yet.
func HashFor(secret *corev1.Secret) *identity.Hash {
	text, ok := vmsecret.PasswordHash(secret)
	if !ok {
		return nil
	}
	h, err := identity.ParseHash(text)
	if err != nil {
		return nil
	}
	return &h
}
