package kube

import "fmt"

// Pod is what the resolver knows about the pod of a process. UID is always
// set for a process in a pod (it comes from the cgroup path); the other
// fields only when a source named the pod.
type Pod struct {
	// UID is the pod's UID as its cgroup path names it. For a static pod
	// this is the kubelet's hash of its manifest, which the API server's
	// mirror pod carries in its kubernetes.io/config.mirror annotation.
	UID       string
	Namespace string
	Name      string
	// Labels are the pod's labels; only the API server knows them. The
	// map is the caller's own copy.
	Labels map[string]string
	// Container is the name of the container the process runs in, where a
	// source could tell.
	Container string
}

// Source says which source answered a lookup, from the least to the most
// complete.
type Source int

// Sources of an answer.
const (
	// SourceNone: the cgroup path names no pod; the process is not in one.
	SourceNone Source = iota
	// SourceCgroup: only the pod UID, from the cgroup path.
	SourceCgroup
	// SourcePodResources: namespace, name and container from the kubelet's
	// pod-resources API, matched by the process's GPUs.
	SourcePodResources
	// SourceAPIServer: namespace, name, labels and container from the API
	// server's pod list.
	SourceAPIServer
)

// String names the source as the status line and logs spell it.
func (s Source) String() string {
	switch s {
	case SourceNone:
		return "none"
	case SourceCgroup:
		return "cgroup"
	case SourcePodResources:
		return "kubelet pod-resources"
	case SourceAPIServer:
		return "api server"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}
