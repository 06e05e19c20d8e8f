package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// mirrorAnnotation holds, on a static pod's mirror in the API server, the
// UID the kubelet gave the static pod, which is the one its cgroups carry.
const mirrorAnnotation = "kubernetes.io/config.mirror"

const uidIndex = "uid"

// watchAPIServer runs an informer on this node's pods until ctx is done,
// publishing its cache once synced and reporting the health of every list
// and watch.
func (r *Resolver) watchAPIServer(ctx context.Context) {
	if r.opts.NodeName == "" {
		r.setHealth(SourceAPIServer, StateDegraded, "node name unknown: pass --node-name (the chart sets it from the downward API's spec.nodeName); without it the daemon would watch every pod of the cluster", 0)
		return
	}
	client, err := r.opts.Client()
	if err != nil {
		r.setHealth(SourceAPIServer, StateDegraded, err.Error(), 0)
		return
	}
	informer := r.podInformer(client)
	if err := informer.SetWatchErrorHandler(func(_ *cache.Reflector, err error) { r.apiServerResult(informer, err) }); err != nil {
		r.setHealth(SourceAPIServer, StateDegraded, fmt.Sprintf("pod informer: %v", err), 0)
		return
	}
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return
	}
	r.api.Store(&podIndex{indexer: informer.GetIndexer()})
	r.apiServerResult(informer, nil)
}

// podInformer watches the pods bound to this node, keeping of each only
// what a lookup reads.
func (r *Resolver) podInformer(client kubernetes.Interface) cache.SharedIndexInformer {
	selector := fields.OneTermEqualSelector("spec.nodeName", r.opts.NodeName).String()
	var informer cache.SharedIndexInformer
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			l, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
			r.apiServerResult(informer, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			w, err := client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
			r.apiServerResult(informer, err)
			return w, err
		},
	}
	node := r.opts.NodeName
	informer = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{}, 0,
		cache.Indexers{uidIndex: func(obj any) ([]string, error) {
			p, ok := obj.(*corev1.Pod)
			if !ok || p.Spec.NodeName != node {
				return nil, nil
			}
			uids := []string{string(p.UID)}
			if m := p.Annotations[mirrorAnnotation]; m != "" {
				uids = append(uids, m)
			}
			return uids, nil
		}})
	_ = informer.SetTransform(trimPod) // fails only once the informer runs
	return informer
}

// apiServerResult records the outcome of a list or watch. Errors that a
// watch ends with in normal operation (the server closing it, an expired
// resource version) are not failures: the informer lists again.
func (r *Resolver) apiServerResult(informer cache.SharedIndexInformer, err error) {
	pods := 0
	if informer != nil {
		pods = len(informer.GetStore().ListKeys())
	}
	switch {
	case err == nil:
		if r.api.Load() == nil {
			return // OK is reported once the cache is complete and published
		}
		r.setHealth(SourceAPIServer, StateOK, fmt.Sprintf("watching the pods of node %s", r.opts.NodeName), pods)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), apierrors.IsResourceExpired(err), apierrors.IsGone(err):
	default:
		r.setHealth(SourceAPIServer, StateDegraded, apiServerDetail(err), pods)
	}
}

// apiServerDetail says what a failed list or watch means and how to fix
// it, in words that stay the same from one retry to the next.
func apiServerDetail(err error) string {
	switch {
	case apierrors.IsForbidden(err):
		return "RBAC forbids the daemon's service account to list or watch pods: bind it to a ClusterRole with get, list and watch on pods (the chart's ClusterRole); retrying"
	case apierrors.IsUnauthorized(err):
		return "the API server refused the daemon's credentials (an expired or revoked service account token); retrying"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the request URL changes between retries; the cause does not
	}
	return fmt.Sprintf("API server unreachable or failing: %s; retrying", strings.TrimSpace(err.Error()))
}

// trimPod keeps of a pod only what lookups and the index read, so the
// cache of a node with hundreds of pods stays small.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: the informer handles it
	}
	t := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion, Labels: p.Labels,
	}}
	if m := p.Annotations[mirrorAnnotation]; m != "" {
		t.Annotations = map[string]string{mirrorAnnotation: m}
	}
	t.Spec.NodeName = p.Spec.NodeName
	for _, set := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range set {
			t.Status.ContainerStatuses = append(t.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, ContainerID: c.ContainerID})
		}
	}
	for _, c := range p.Status.EphemeralContainerStatuses {
		t.Status.ContainerStatuses = append(t.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, ContainerID: c.ContainerID})
	}
	return t, nil
}

// podIndex answers lookups from the informer's cache.
type podIndex struct {
	indexer cache.Indexer
}

// lookup finds the pod by UID (or a static pod's hash) and, when below
// (the cgroup path under the pod's) names one of its containers' IDs, that
// container.
func (x *podIndex) lookup(uid, below string) (Pod, bool) {
	objs, err := x.indexer.ByIndex(uidIndex, uid)
	if err != nil || len(objs) == 0 {
		return Pod{}, false
	}
	p := objs[0].(*corev1.Pod)
	out := Pod{UID: uid, Namespace: p.Namespace, Name: p.Name, Labels: cloneLabels(p.Labels)}
	if below != "" {
		for _, c := range p.Status.ContainerStatuses {
			// containerd://ID, cri-o://ID, docker://ID
			if _, id, ok := strings.Cut(c.ContainerID, "://"); ok && len(id) >= 12 && strings.Contains(below, id) {
				out.Container = c.Name
				break
			}
		}
	}
	return out, true
}
