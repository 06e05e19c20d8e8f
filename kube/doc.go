// Package kube says which Kubernetes pod a process runs in: its namespace,
// name, labels and container, for the policy input.
//
// A [Resolver] combines three sources and answers every lookup from what it
// already holds, never from a network call on the caller's path:
//
//   - the API server, through a client-go informer that watches only this
//     node's pods (field selector spec.nodeName=NODE): namespace, name,
//     labels and, from the pod's container statuses, the container;
//   - the kubelet's pod-resources API (v1, gRPC on the unix socket
//     /var/lib/kubelet/pod-resources/kubelet.sock), polled: which pod and
//     container each GPU was allocated to, as NVIDIA's dcgm-exporter maps
//     GPUs to pods. It names no pod UID, so it answers only for a process
//     whose allocated GPUs match exactly one container's;
//   - the process's cgroup path, always: the pod UID is in it for every
//     layout the kubelet makes (cgroup v1 and v2, the systemd and cgroupfs
//     drivers), see [PodUID].
//
// Missing or bad Kubernetes data (no socket, no in-cluster configuration,
// RBAC forbidding the pod list, an API server that is down) degrades the
// answer to what the cgroup path says, and the resolver reports each change
// of a source's health once ([Options.OnChange], [Resolver.Status]).
package kube
