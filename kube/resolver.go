package kube

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultPodResourcesSocket is where the kubelet serves its pod-resources
// API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Defaults of [Options].
const (
	DefaultRefresh           = 10 * time.Second
	DefaultTimeout           = 5 * time.Second
	DefaultGPUResourcePrefix = "nvidia.com/"
)

// Options configure a Resolver. The zero value resolves from cgroup paths
// only.
type Options struct {
	// NodeName is this node's name (the daemon's --node-name, from the
	// downward API's spec.nodeName). The API server source needs it: it
	// watches only the pods bound to this node.
	NodeName string
	// Client makes the API server client; nil disables that source. The
	// daemon passes [InClusterClient].
	Client func() (kubernetes.Interface, error)
	// PodResourcesSocket is the kubelet's pod-resources socket; empty
	// disables that source. The daemon passes [DefaultPodResourcesSocket]
	// unless told otherwise.
	PodResourcesSocket string
	// Refresh is how often the kubelet's pod-resources list is read again
	// (default [DefaultRefresh]); Timeout bounds each read (default
	// [DefaultTimeout]).
	Refresh, Timeout time.Duration
	// GPUResourcePrefix selects the extended resources whose device IDs
	// are GPUs (default [DefaultGPUResourcePrefix]: nvidia.com/gpu,
	// nvidia.com/mig-1g.10gb, …).
	GPUResourcePrefix string
	// OnChange is called, from the resolver's own goroutines, each time a
	// source's state or detail changes: once when it first answers or
	// fails, once when it recovers, never for every retry. The daemon logs
	// it.
	OnChange func(Health)
}

// Resolver answers which pod a process runs in from a local cache of what
// the API server and the kubelet said. It is safe for concurrent use; a
// lookup never waits for a source.
type Resolver struct {
	opts  Options
	api   atomic.Pointer[podIndex]
	alloc atomic.Pointer[allocations]

	mu     sync.Mutex
	status Status
}

// New returns a resolver; it answers from cgroup paths alone until Start.
func New(opts Options) *Resolver {
	if opts.Refresh <= 0 {
		opts.Refresh = DefaultRefresh
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.GPUResourcePrefix == "" {
		opts.GPUResourcePrefix = DefaultGPUResourcePrefix
	}
	now := time.Now()
	return &Resolver{opts: opts, status: Status{
		APIServer:    Health{Source: SourceAPIServer, Since: now},
		PodResources: Health{Source: SourcePodResources, Since: now},
	}}
}

// Start begins watching the configured sources in the background and
// returns at once. They stop when ctx is done.
func (r *Resolver) Start(ctx context.Context) {
	if r.opts.Client == nil {
		r.setHealth(SourceAPIServer, StateDisabled, "not configured", 0)
	} else {
		go r.watchAPIServer(ctx)
	}
	if r.opts.PodResourcesSocket == "" {
		r.setHealth(SourcePodResources, StateDisabled, "no socket configured", 0)
	} else {
		go r.pollPodResources(ctx)
	}
}

// Pod says which pod the process pid runs in. cgroupPath is the process's
// cgroup (its cgroup v2 path, or the v1 cpu hierarchy's, from
// /proc/PID/cgroup); gpus are the device IDs the process was allocated, as
// its NVIDIA_VISIBLE_DEVICES lists them (GPU or MIG UUIDs), or nil.
//
// The API server's answer is preferred; then the kubelet's, which only a
// process whose GPUs are exactly one container's allocation gets; then
// the cgroup path's pod UID alone. A process outside any pod gets
// SourceNone. Only a bad argument is an error.
func (r *Resolver) Pod(pid int, cgroupPath string, gpus []string) (Pod, Source, error) {
	if pid < 1 {
		return Pod{}, SourceNone, fmt.Errorf("pod lookup: pid %d is not a process id", pid)
	}
	if cgroupPath == "" {
		return Pod{}, SourceNone, fmt.Errorf("pod lookup of process %d: empty cgroup path (read it from /proc/%d/cgroup)", pid, pid)
	}
	uid, below, ok := PodUID(cgroupPath)
	if !ok {
		return Pod{}, SourceNone, nil
	}
	if idx := r.api.Load(); idx != nil {
		if p, ok := idx.lookup(uid, below); ok {
			return p, SourceAPIServer, nil
		}
	}
	if a := r.alloc.Load(); a != nil {
		if m, ok := a.match(gpus); ok {
			return Pod{UID: uid, Namespace: m.namespace, Name: m.pod, Container: m.container}, SourcePodResources, nil
		}
	}
	return Pod{UID: uid}, SourceCgroup, nil
}

// ByUID returns the namespace, name and labels of the pod with this UID as
// the API server listed it (the container is left empty). It is what
// policy.ProcOptions.Pod asks.
func (r *Resolver) ByUID(uid string) (Pod, bool) {
	idx := r.api.Load()
	if idx == nil {
		return Pod{}, false
	}
	return idx.lookup(uid, "")
}

// Status returns the health of every source.
func (r *Resolver) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// setHealth records a source's state and reports a change of state or
// detail to OnChange; a new pod count alone is not a change.
func (r *Resolver) setHealth(src Source, state State, detail string, pods int) {
	r.mu.Lock()
	h := &r.status.APIServer
	if src == SourcePodResources {
		h = &r.status.PodResources
	}
	h.Pods = pods
	changed := h.State != state || h.Detail != detail
	if changed {
		h.State, h.Detail, h.Since = state, detail, time.Now()
	}
	out := *h
	r.mu.Unlock()
	if changed && r.opts.OnChange != nil {
		r.opts.OnChange(out)
	}
}

// InClusterClient is the API server client of a pod: the service account
// token and CA that Kubernetes mounts in every pod.
func InClusterClient() (kubernetes.Interface, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no in-cluster configuration (%w): the daemon runs outside a pod or without a service account token; pod labels need the chart's ServiceAccount", err)
	}
	cfg.UserAgent = "arbiter"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("api server client: %w", err)
	}
	return c, nil
}

func cloneLabels(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}
