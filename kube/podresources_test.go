package kube

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubelet serves the published pod-resources v1 API on a unix socket, as
// the kubelet does, with a list the test sets.
type kubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	mu    sync.Mutex
	pods  []*podresourcesapi.PodResources
	delay time.Duration
	calls int // List calls begun
	ended int // and returned
}

func (k *kubelet) List(ctx context.Context, _ *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	k.mu.Lock()
	k.calls++
	pods, delay := k.pods, k.delay
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.ended++
		k.mu.Unlock()
	}()
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: pods}, nil
}

func (k *kubelet) set(delay time.Duration, pods ...*podresourcesapi.PodResources) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods, k.delay = pods, delay
}

func (k *kubelet) listCalls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls
}

// listsEnded is how many List calls have returned.
func (k *kubelet) listsEnded() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ended
}

// socketDir is a short directory for unix sockets (their paths are
// limited to 107 bytes).
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kube")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// serve starts srv on a unix socket at path and stops it at the end of
// the test; the returned func stops it earlier.
func serve(t *testing.T, path string, srv podresourcesapi.PodResourcesListerServer) func() {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(g, srv)
	go g.Serve(l)
	var once sync.Once
	stop := func() { once.Do(g.Stop) }
	t.Cleanup(stop)
	return stop
}

func podRes(ns, name string, containers ...*podresourcesapi.ContainerResources) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: ns, Name: name, Containers: containers}
}

func ctr(name string, devices ...*podresourcesapi.ContainerDevices) *podresourcesapi.ContainerResources {
	return &podresourcesapi.ContainerResources{Name: name, Devices: devices}
}

func dev(resource string, ids ...string) *podresourcesapi.ContainerDevices {
	return &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

// changes records every OnChange call.
type changes struct {
	mu  sync.Mutex
	all []Health
}

func (c *changes) record(h Health) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, h)
}

func (c *changes) of(src Source) []Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Health
	for _, h := range c.all {
		if h.Source == src {
			out = append(out, h)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func startResolver(t *testing.T, opts Options) (*Resolver, *changes) {
	t.Helper()
	ch := &changes{}
	opts.OnChange = ch.record
	if opts.Refresh == 0 {
		opts.Refresh = 10 * time.Millisecond
	}
	r := New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.Start(ctx)
	return r, ch
}

const (
	gpuA = "GPU-6b0ac4e1-58f2-4e21-9c4e-3f3c7a0b1d01"
	gpuB = "GPU-6b0ac4e1-58f2-4e21-9c4e-3f3c7a0b1d02"
	migC = "MIG-1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b"
)

var podCgroup = "/kubepods/burstable/pod" + testUID + "/" + testCID

func TestPodResourcesMatchesGPUs(t *testing.T) {
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	k := &kubelet{}
	k.set(0,
		podRes("serving", "llm-0", ctr("server", dev("nvidia.com/gpu", gpuA), dev("rdma/hca", "mlx5_0")), ctr("sidecar")),
		podRes("batch", "train-7", ctr("trainer", dev("nvidia.com/gpu", gpuB))),
		podRes("batch", "mig-1", ctr("worker", dev("nvidia.com/mig-1g.10gb", migC))),
		podRes("kube-system", "coredns"),
	)
	serve(t, sock, k)
	r, ch := startResolver(t, Options{PodResourcesSocket: sock})
	waitFor(t, "pod-resources ok", func() bool { return r.Status().PodResources.State == StateOK })
	if got := r.Status().PodResources.Pods; got != 4 {
		t.Errorf("pods = %d, want 4", got)
	}

	tests := []struct {
		gpus      []string
		src       Source
		ns, name  string
		container string
	}{
		{[]string{gpuA}, SourcePodResources, "serving", "llm-0", "server"},
		{[]string{" " + gpuB, gpuB}, SourcePodResources, "batch", "train-7", "trainer"},
		{[]string{migC}, SourcePodResources, "batch", "mig-1", "worker"},
		{[]string{gpuA, gpuB}, SourceCgroup, "", "", ""}, // no container has both
		{[]string{"all"}, SourceCgroup, "", "", ""},      // not a device
		{nil, SourceCgroup, "", "", ""},
	}
	for _, tc := range tests {
		p, src, err := r.Pod(42, podCgroup, tc.gpus)
		if err != nil {
			t.Fatal(err)
		}
		if src != tc.src || p.UID != testUID || p.Namespace != tc.ns || p.Name != tc.name || p.Container != tc.container || p.Labels != nil {
			t.Errorf("Pod(%v) = %+v from %s; want %s/%s container %q from %s", tc.gpus, p, src, tc.ns, tc.name, tc.container, tc.src)
		}
	}
	// A process outside any pod is not matched by its GPUs.
	if p, src, err := r.Pod(42, "/system.slice/vllm.service", []string{gpuA}); err != nil || src != SourceNone || p.UID != "" {
		t.Errorf("process outside pods: %+v from %s, %v", p, src, err)
	}

	// Polls continue; the state was reported once.
	calls := k.listCalls()
	waitFor(t, "more polls", func() bool { return k.listCalls() >= calls+3 })
	if got := ch.of(SourcePodResources); len(got) != 1 || got[0].State != StateOK {
		t.Errorf("changes = %v, want one ok", got)
	}
}

func TestPodResourcesTimeSlicedGPUIsAmbiguous(t *testing.T) {
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	k := &kubelet{}
	// NVIDIA's device plugin names the replicas of a time-sliced GPU
	// UUID::N; both pods then hold the same GPU.
	k.set(0,
		podRes("serving", "llm-0", ctr("server", dev("nvidia.com/gpu", gpuA+"::0"))),
		podRes("batch", "train-7", ctr("trainer", dev("nvidia.com/gpu", gpuA+"::1"))),
		podRes("batch", "solo", ctr("w", dev("nvidia.com/gpu", gpuB+"::3"))),
	)
	serve(t, sock, k)
	r, _ := startResolver(t, Options{PodResourcesSocket: sock})
	waitFor(t, "pod-resources ok", func() bool { return r.Status().PodResources.State == StateOK })
	if p, src, _ := r.Pod(7, podCgroup, []string{gpuA}); src != SourceCgroup || p.Namespace != "" {
		t.Errorf("shared GPU answered %+v from %s; want the cgroup's UID only", p, src)
	}
	if p, src, _ := r.Pod(7, podCgroup, []string{gpuB}); src != SourcePodResources || p.Name != "solo" {
		t.Errorf("one replica's GPU answered %+v from %s; want batch/solo", p, src)
	}
}

func TestPodResourcesNoSocket(t *testing.T) {
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	r, ch := startResolver(t, Options{PodResourcesSocket: sock})
	waitFor(t, "degraded", func() bool { return r.Status().PodResources.State == StateDegraded })
	h := r.Status().PodResources
	if !strings.Contains(h.Detail, "no kubelet pod-resources socket at "+sock) || !strings.Contains(h.Detail, "/var/lib/kubelet/pod-resources") {
		t.Errorf("detail %q does not say what is missing and where to mount it", h.Detail)
	}
	if p, src, err := r.Pod(9, podCgroup, []string{gpuA}); err != nil || src != SourceCgroup || p.UID != testUID || p.Namespace != "" || p.Name != "" {
		t.Errorf("Pod = %+v from %s, %v; want the cgroup's UID", p, src, err)
	}
	time.Sleep(100 * time.Millisecond) // ten more polls
	if got := ch.of(SourcePodResources); len(got) != 1 {
		t.Errorf("reported %d times, want once: %v", len(got), got)
	}
	if s := r.Status().String(); !strings.Contains(s, "pod UID from the cgroup path only") {
		t.Errorf("status line %q does not say what lookups fall back to", s)
	}
}

func TestPodResourcesStaleSocket(t *testing.T) {
	// The kubelet died and left its socket behind.
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	r, _ := startResolver(t, Options{PodResourcesSocket: sock, Timeout: time.Second})
	waitFor(t, "degraded", func() bool { return r.Status().PodResources.State == StateDegraded })
	if d := r.Status().PodResources.Detail; !strings.Contains(d, "nothing answers") {
		t.Errorf("detail %q", d)
	}
}

func TestPodResourcesUnimplemented(t *testing.T) {
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	serve(t, sock, &struct {
		podresourcesapi.UnimplementedPodResourcesListerServer
	}{})
	r, _ := startResolver(t, Options{PodResourcesSocket: sock})
	waitFor(t, "degraded", func() bool { return r.Status().PodResources.State == StateDegraded })
	if d := r.Status().PodResources.Detail; !strings.Contains(d, "does not serve the pod-resources v1 List") {
		t.Errorf("detail %q", d)
	}
}

func TestPodResourcesSlowKubeletNeverBlocksLookups(t *testing.T) {
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	k := &kubelet{}
	k.set(0, podRes("serving", "llm-0", ctr("server", dev("nvidia.com/gpu", gpuA))))
	serve(t, sock, k)
	// A timeout no healthy List comes near on a loaded machine, so that
	// the only changes are the ones the test makes.
	r, ch := startResolver(t, Options{PodResourcesSocket: sock, Timeout: 2 * time.Second})
	waitFor(t, "ok", func() bool { return r.Status().PodResources.State == StateOK })

	k.set(time.Hour) // the kubelet hangs
	calls := k.listCalls()
	waitFor(t, "a hanging list", func() bool { return k.listCalls() > calls })
	start := time.Now()
	p, src, _ := r.Pod(5, podCgroup, []string{gpuA})
	// The lookup returned while the hanging List was still waiting: it
	// did not wait for it (that List ends only at the 2 s timeout).
	if took, ended := time.Since(start), k.listsEnded(); ended > calls {
		t.Errorf("lookup took %v, returning after the hanging List ended (%d of %d calls ended)", took, ended, calls+1)
	}
	if src != SourcePodResources || p.Name != "llm-0" {
		t.Errorf("lookup during the hang = %+v from %s; want the last list's answer", p, src)
	}
	waitFor(t, "deadline", func() bool { return r.Status().PodResources.State == StateDegraded })
	if d := r.Status().PodResources.Detail; !strings.Contains(d, "did not answer") {
		t.Errorf("detail %q", d)
	}
	// The kubelet answers again: recovery is reported once.
	k.set(0, podRes("serving", "llm-0", ctr("server", dev("nvidia.com/gpu", gpuA))))
	waitFor(t, "recovered", func() bool { return r.Status().PodResources.State == StateOK })
	got := ch.of(SourcePodResources)
	if len(got) != 3 || got[0].State != StateOK || got[1].State != StateDegraded || got[2].State != StateOK {
		t.Errorf("changes = %v, want ok, degraded, ok", got)
	}
}

func TestPodResourcesKubeletRestart(t *testing.T) {
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	k := &kubelet{}
	k.set(0, podRes("serving", "llm-0", ctr("server", dev("nvidia.com/gpu", gpuA))))
	stop := serve(t, sock, k)
	r, _ := startResolver(t, Options{PodResourcesSocket: sock, Timeout: time.Second})
	waitFor(t, "ok", func() bool { return r.Status().PodResources.State == StateOK })
	stop() // removes the socket
	waitFor(t, "degraded", func() bool { return r.Status().PodResources.State == StateDegraded })
	if _, src, _ := r.Pod(5, podCgroup, []string{gpuA}); src != SourcePodResources {
		t.Errorf("the last list was dropped: answered from %s", src)
	}
	k.set(0, podRes("serving", "llm-1", ctr("server", dev("nvidia.com/gpu", gpuA))))
	serve(t, sock, k)
	waitFor(t, "the new list", func() bool {
		p, _, _ := r.Pod(5, podCgroup, []string{gpuA})
		return p.Name == "llm-1"
	})
	if r.Status().PodResources.State != StateOK {
		t.Errorf("status %v after the restart", r.Status().PodResources)
	}
}

func TestNormalizeGPUs(t *testing.T) {
	got := normalizeGPUs([]string{gpuB + "::2", "", "void", gpuA, gpuB, " " + gpuA + " ", "none"})
	if strings.Join(got, ",") != gpuA+","+gpuB {
		t.Errorf("normalizeGPUs = %v", got)
	}
}
