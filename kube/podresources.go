package kube

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// maxPodResourcesMessage bounds the kubelet's answer, as dcgm-exporter
// does: a node's full list is far smaller.
const maxPodResourcesMessage = 16 << 20

// pollPodResources reads the kubelet's pod-resources list now and every
// Refresh until ctx is done.
func (r *Resolver) pollPodResources(ctx context.Context) {
	path := r.opts.PodResourcesSocket
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPodResourcesMessage)))
	if err != nil {
		r.setHealth(SourcePodResources, StateDegraded, fmt.Sprintf("kubelet pod-resources socket %s: %v", path, err), 0)
		return
	}
	defer conn.Close()
	client := podresourcesapi.NewPodResourcesListerClient(conn)
	tick := time.NewTicker(r.opts.Refresh)
	defer tick.Stop()
	for {
		r.readPodResources(ctx, client)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// readPodResources lists the kubelet's allocations once and publishes
// them. A failure keeps the last list: allocations of running pods do not
// change.
func (r *Resolver) readPodResources(ctx context.Context, client podresourcesapi.PodResourcesListerClient) {
	path := r.opts.PodResourcesSocket
	pods := 0
	if a := r.alloc.Load(); a != nil {
		pods = a.pods
	}
	if _, err := os.Stat(path); err != nil {
		detail := fmt.Sprintf("cannot read the kubelet's pod-resources socket: %v", err)
		if errors.Is(err, fs.ErrNotExist) {
			detail = fmt.Sprintf("no kubelet pod-resources socket at %s: mount the host's /var/lib/kubelet/pod-resources there (the chart does) or point --kubelet-socket at it", path)
		}
		r.setHealth(SourcePodResources, StateDegraded, detail, pods)
		return
	}
	callCtx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	resp, err := client.List(callCtx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		r.setHealth(SourcePodResources, StateDegraded, podResourcesDetail(path, err), pods)
		return
	}
	a := newAllocations(resp.GetPodResources(), r.opts.GPUResourcePrefix)
	r.alloc.Store(a)
	r.setHealth(SourcePodResources, StateOK, fmt.Sprintf("reading %s", path), a.pods)
}

// podResourcesDetail says what a failed List means.
func podResourcesDetail(path string, err error) string {
	switch status.Code(err) {
	case codes.Unimplemented:
		return fmt.Sprintf("the kubelet at %s does not serve the pod-resources v1 List (Kubernetes 1.20 or later does)", path)
	case codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Sprintf("the kubelet at %s refused the pod-resources list: %s", path, status.Convert(err).Message())
	case codes.DeadlineExceeded:
		return fmt.Sprintf("the kubelet at %s did not answer the pod-resources list in time; retrying", path)
	case codes.Unavailable:
		return fmt.Sprintf("nothing answers on the kubelet's pod-resources socket %s (is the kubelet running?); retrying", path)
	}
	return fmt.Sprintf("kubelet pod-resources list at %s failed: %s; retrying", path, status.Convert(err).Message())
}

// allocations is one reading of the kubelet's pod-resources list: the
// GPUs of every container that was allocated any.
type allocations struct {
	pods       int
	containers []allocation
}

// allocation is one container's GPUs, normalized and sorted.
type allocation struct {
	namespace, pod, container string
	gpus                      []string
}

func newAllocations(pods []*podresourcesapi.PodResources, prefix string) *allocations {
	a := &allocations{pods: len(pods)}
	for _, p := range pods {
		for _, c := range p.GetContainers() {
			var gpus []string
			for _, d := range c.GetDevices() {
				if strings.HasPrefix(d.GetResourceName(), prefix) {
					gpus = append(gpus, d.GetDeviceIds()...)
				}
			}
			if gpus = normalizeGPUs(gpus); len(gpus) > 0 {
				a.containers = append(a.containers, allocation{namespace: p.GetNamespace(), pod: p.GetName(), container: c.GetName(), gpus: gpus})
			}
		}
	}
	return a
}

// match returns the one container whose GPUs are exactly gpus. Two
// containers allocated the same GPUs (time-slicing replicas of one GPU
// share its UUID) cannot be told apart, so neither is answered: a wrong
// namespace would give a process another team's class.
func (a *allocations) match(gpus []string) (allocation, bool) {
	want := normalizeGPUs(gpus)
	if len(want) == 0 {
		return allocation{}, false
	}
	var found []allocation
	for _, c := range a.containers {
		if slices.Equal(c.gpus, want) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		return allocation{}, false
	}
	return found[0], true
}

// normalizeGPUs sorts and deduplicates device IDs, dropping the "::N"
// suffix by which NVIDIA's device plugin names the time-slicing replicas
// of one GPU, and the empty IDs and the words (all, none, void) that
// NVIDIA_VISIBLE_DEVICES uses for no particular device.
func normalizeGPUs(ids []string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		id, _, _ = strings.Cut(strings.TrimSpace(id), "::")
		switch id {
		case "", "all", "none", "void":
			continue
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
