package kube

import "strings"

// PodUID returns the UID of the pod that a cgroup path belongs to, and the
// rest of the path below the pod's own cgroup (where the container's cgroup
// is). It understands every layout the kubelet makes:
//
//	cgroupfs driver:  /kubepods/burstable/pod<uid>/<container id>
//	                  /kubepods/pod<uid>/crio-<container id>
//	systemd driver:   /kubepods.slice/kubepods-besteffort.slice/
//	                  kubepods-besteffort-pod<uid with _>.slice/cri-containerd-<id>.scope
//
// under any parent (kind and other nested setups put /kubelet.slice/… or
// /docker/<id>/… in front), for cgroup v2 and each v1 hierarchy alike. A
// UID is a 36-character UUID or, for a static pod, the kubelet's
// 32-character hash. ok is false for a path outside a kubepods cgroup.
func PodUID(cgroupPath string) (uid, below string, ok bool) {
	parts := strings.Split(strings.Trim(cgroupPath, "/"), "/")
	inKube := false
	for i, part := range parts {
		if strings.HasPrefix(part, "kubepods") || strings.Contains(part, "-kubepods") {
			inKube = true
		}
		if !inKube {
			continue
		}
		if u, ok := podComponent(part); ok {
			return u, strings.Join(parts[i+1:], "/"), true
		}
	}
	return "", "", false
}

// podComponent reads the UID from one path component: pod<uid> (cgroupfs)
// or <parent>-pod<uid with _ for ->.slice (systemd, which escapes dashes).
func podComponent(part string) (string, bool) {
	if s, ok := strings.CutSuffix(part, ".slice"); ok {
		i := strings.LastIndex(s, "-pod")
		if i < 0 || !strings.Contains(s[:i], "kubepods") {
			return "", false
		}
		uid := strings.ReplaceAll(s[i+len("-pod"):], "_", "-")
		return uid, validUID(uid)
	}
	uid, ok := strings.CutPrefix(part, "pod")
	return uid, ok && validUID(uid)
}

// validUID accepts a lowercase UUID (8-4-4-4-12) or a static pod's
// 32-digit hex hash.
func validUID(s string) bool {
	switch len(s) {
	case 32:
		return isHex(s)
	case 36:
		for _, i := range []int{8, 13, 18, 23} {
			if s[i] != '-' {
				return false
			}
		}
		return isHex(s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:])
	}
	return false
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
