package input

import (
	"regexp"
	"strings"
)

var (
	containerID = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// systemd-driver scopes: docker-ID.scope, cri-containerd-ID.scope,
	// crio-ID.scope, libpod-ID.scope (crio-conmon-ID is the monitor, not the
	// container).
	scopeID = regexp.MustCompile(`^(docker|cri-containerd|crio|libpod)-([0-9a-f]{64})\.scope$`)
	// kubepods-burstable-pod<uid with _>.slice or cgroupfs pod<uid with ->.
	podSlice = regexp.MustCompile(`^kubepods(?:-(besteffort|burstable|guaranteed))?-pod([0-9a-f_]{36})\.slice$`)
	podDir   = regexp.MustCompile(`^pod([0-9a-f-]{36})$`)
	crioDir  = regexp.MustCompile(`^crio-([0-9a-f]{64})$`)
)

var runtimes = map[string]string{"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o", "libpod": "podman"}

// ParseCgroup reads what a cgroup path says: the systemd slice and unit,
// the container ID and runtime, and the Kubernetes pod UID and QoS class.
// It understands the cgroupfs and systemd cgroup drivers as docker,
// containerd, CRI-O, podman and the kubelet name them. Unknown layouts
// yield only Path (and Slice/Unit when systemd named them).
func ParseCgroup(path string) Cgroup {
	c := Cgroup{Path: path}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	inKube := false
	for i, part := range parts {
		switch {
		case part == "kubepods" || part == "kubepods.slice":
			inKube = true
		case inKube && (part == "besteffort" || part == "burstable"):
			c.QoS = part
		case strings.HasSuffix(part, ".slice"):
			c.Slice = part
			if m := podSlice.FindStringSubmatch(part); m != nil {
				c.PodUID = strings.ReplaceAll(m[2], "_", "-")
				if m[1] != "" {
					c.QoS = m[1]
				}
			} else if q, ok := strings.CutPrefix(part, "kubepods-"); ok && (q == "besteffort.slice" || q == "burstable.slice") {
				c.QoS = strings.TrimSuffix(q, ".slice")
			}
		case strings.HasSuffix(part, ".service") || strings.HasSuffix(part, ".scope"):
			c.Unit = part
			if m := scopeID.FindStringSubmatch(part); m != nil {
				c.ContainerID, c.Runtime = m[2], runtimes[m[1]]
			}
		case podDir.MatchString(part) && inKube:
			c.PodUID = part[3:]
		case crioDir.MatchString(part):
			c.ContainerID, c.Runtime = part[5:], "cri-o"
		case containerID.MatchString(part):
			c.ContainerID = part
			switch {
			case i > 0 && parts[i-1] == "docker":
				c.Runtime = "docker"
			case i > 0 && parts[i-1] == "libpod_parent":
				c.Runtime = "podman"
			case inKube:
				c.Runtime = "containerd" // cgroupfs driver; docker-shim names differ only in ancestry
			}
		}
	}
	if c.PodUID != "" && c.QoS == "" {
		c.QoS = "guaranteed" // the kubelet gives guaranteed pods no QoS level
	}
	return c
}
