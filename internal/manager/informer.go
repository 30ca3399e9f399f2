package manager

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// ListPage is how many objects a page of an informer's list holds: the
// most a PagedInformers informer holds untrimmed at once.
const ListPage = 500

// NewInformerFunc is what cache.Options.NewInformer takes.
type NewInformerFunc = func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer

// PagedInformers returns client-go's informers (a cache.Options.NewInformer)
// that list in pages of ListPage objects, each object trimmed by its
// kind's trim (trimFor) as its page arrives. An informer's first list
// otherwise asks for version "0", which the API server serves whole from
// its watch cache whatever the limit, and the informer holds it whole,
// every payload of it, until every object is in its store, and only then
// applies its transform: with 10,000 opted-in VMs, hundreds of MiB at once
// (BenchmarkOptedInVMs). scheme names the kind of a typed object that does
// not carry it.
func PagedInformers(scheme *runtime.Scheme, trimFor func(schema.GroupKind) toolscache.TransformFunc) NewInformerFunc {
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		gvk := obj.GetObjectKind().GroupVersionKind()
		if gvk.Empty() {
			gvk, _ = apiutil.GVKForObject(obj, scheme) // the cache's scheme knows every type it caches
		}
		return toolscache.NewSharedIndexInformer(pagedList{ListerWatcherWithContext: toolscache.ToListerWatcherWithContext(lw), trim: trimFor(gvk.GroupKind())}, obj, resync, indexers)
	}
}

// pagedList lists in pages of ListPage objects, trims each object as its
// page arrives, and returns them all as one list; it watches as it is.
type pagedList struct {
	toolscache.ListerWatcherWithContext
	trim toolscache.TransformFunc
}

// ListWithContext lists what opts select, the latest version: a list in
// pages is one consistent snapshot, and any API server serves it (a list
// not older than a version it names is served from the watch cache only
// once that cache reached the version, which for a kind nobody writes
// needs a progress notification its etcd may not support).
func (l pagedList) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	opts.ResourceVersion, opts.ResourceVersionMatch, opts.Continue, opts.Limit = "", "", "", ListPage
	var (
		// last is the last page listed: the list returned, of its kind
		// and version (every page of a list is one snapshot's).
		last  runtime.Object
		items []runtime.Object
	)
	pages := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		page, err := l.ListerWatcherWithContext.ListWithContext(ctx, opts)
		if err == nil {
			last = page
		}
		return page, err
	})
	pages.PageSize, pages.PageBufferSize = ListPage, 0
	err := pages.EachListItemWithAlloc(ctx, opts, func(o runtime.Object) error {
		trimmed, err := l.trim(o)
		if err != nil {
			return err
		}
		items = append(items, trimmed.(runtime.Object))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := meta.SetList(last, items); err != nil {
		return nil, err
	}
	accessor, err := meta.ListAccessor(last)
	if err != nil {
		return nil, err
	}
	accessor.SetContinue("")
	accessor.SetRemainingItemCount(nil)
	return last, nil
}

// List is ListWithContext without one.
func (l pagedList) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

// Watch is WatchWithContext without one.
func (l pagedList) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}
