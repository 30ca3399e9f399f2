package mutate

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// TestTheWebhookReadsCredentialSecretsAsFreshAsACache runs NewHandler's
// reads against a real API server and the webhook's cache (CacheOptions):
// a Secret is read whole from the API server once per version, and served
// from memory while its cached metadata says it is that version; a change
// is read again; a Secret the cache does not hold (not a credential
// Secret) is not found, as from the cache.
func TestTheWebhookReadsCredentialSecretsAsFreshAsACache(t *testing.T) {
	ctx := context.Background()
	api := testbed.StartAPIServer(t, testbed.APIServerOptions{})
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	opts := CacheOptions()
	opts.Scheme = api.Scheme
	informers, err := cache.New(api.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	cacheCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() { _ = informers.Start(cacheCtx) }()
	reads := 0
	counted, err := client.NewWithWatch(api.Config, client.Options{Scheme: api.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	apiReader := interceptor.NewClient(counted, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				reads++
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	h := NewHandler(informers, apiReader, api.Client, nil)

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SecretName("web"), Namespace: "team-a", Labels: vmsecret.Labels("web", types.NamespacedName{Namespace: "backup", Name: "main"})},
		Data:       map[string][]byte{vmsecret.KeyPassword: []byte("first-password-of-web"), vmsecret.KeyUserData: []byte("#cloud-config\n")},
	}
	if err := api.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	read := func() *corev1.Secret {
		t.Helper()
		got := &corev1.Secret{}
		if err := h.Cache.Get(ctx, client.ObjectKeyFromObject(secret), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	// The first read waits for the cache to sync, as the webhook's does.
	waitFor := func(what string, cond func(*corev1.Secret) bool) *corev1.Secret {
		t.Helper()
		var got *corev1.Secret
		if err := testbed.WaitFor(30*time.Second, 50*time.Millisecond, func() (bool, error) {
			got = &corev1.Secret{}
			err := h.Cache.Get(ctx, client.ObjectKeyFromObject(secret), got)
			return err == nil && cond(got), err
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return got
	}
	first := waitFor("the Secret", func(s *corev1.Secret) bool { return true })
	before := reads
	if again := read(); again.ResourceVersion != first.ResourceVersion || string(again.Data[vmsecret.KeyPassword]) != "first-password-of-web" {
		t.Fatalf("read again: %+v", again)
	}
	if reads != before {
		t.Errorf("an unchanged Secret was read from the API server again (%d reads)", reads-before)
	}

	secret.Data[vmsecret.KeyPassword] = []byte("second-password-of-web")
	if err := api.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	waitFor("the changed Secret", func(s *corev1.Secret) bool { return string(s.Data[vmsecret.KeyPassword]) == "second-password-of-web" })

	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName("db"), Namespace: "team-a"}, Data: map[string][]byte{"token": []byte("someone's")}}
	if err := api.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if err := h.Cache.Get(ctx, client.ObjectKeyFromObject(foreign), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Secret that is not a credential Secret: %v, want not found (the cache holds none)", err)
	}
}
