package mutate

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// recentSecrets bounds the whole credential Secrets the webhook keeps: those
// of the VMs admitted most recently (a GitOps tool applying its manifests
// again admits them in a burst). A Secret is about 20 KiB, mostly its
// payload.
const recentSecrets = 1024

// NewHandler is the Handler as the webhook runs it: it reads BSLSs and
// namespaces from cache, the credential Secrets through secretReads (their
// metadata from cache, the Secrets themselves from api, remembered by
// version), and decides writes and denials on api's reads.
//
// Caching every credential Secret whole would hold every VM's payload, its
// cloud-init or disk's files, about 20 KiB each: 200 MiB for 10,000 VMs
// (make bench, BenchmarkOptedInVMs), for re-admissions that change
// nothing, which only an edit of a VM's guestbackup annotations, volumes
// or disks sends. cache must be the manager's cache as CacheOptions sets
// it up.
func NewHandler(cache, api client.Reader, writer client.Writer, recorder record.EventRecorder) *Handler {
	return &Handler{
		Cache:  secretReads{Reader: cache, secrets: &secretCache{meta: cache, api: api, recent: lru.New(recentSecrets)}},
		Reader: api, Writer: writer, Recorder: recorder,
	}
}

// secretReads reads Secrets through its secretCache and everything else
// from its Reader.
type secretReads struct {
	client.Reader
	secrets *secretCache
}

// Get reads a Secret through the secretCache.
func (r secretReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if s, ok := obj.(*corev1.Secret); ok {
		return r.secrets.get(ctx, key, s)
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// secretCache serves credential Secrets as fresh as a cache of them would:
// a cache of their metadata says whether one exists and at which version,
// and the whole Secret comes from the recent ones when it is that version,
// else from the API server.
type secretCache struct {
	meta, api client.Reader
	// recent holds whole Secrets (*corev1.Secret) by key, as read.
	recent *lru.Cache
}

func (c *secretCache) get(ctx context.Context, key client.ObjectKey, s *corev1.Secret) error {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := c.meta.Get(ctx, key, m); err != nil {
		return err // not found, as the cache says
	}
	if v, ok := c.recent.Get(key); ok {
		if held := v.(*corev1.Secret); held.ResourceVersion == m.ResourceVersion {
			held.DeepCopyInto(s)
			return nil
		}
	}
	if err := c.api.Get(ctx, key, s); err != nil {
		return fmt.Errorf("read Secret %s: %w", key, err)
	}
	c.recent.Add(key, s.DeepCopy())
	return nil
}
