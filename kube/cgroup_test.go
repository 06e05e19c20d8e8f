package kube

import (
	"strings"
	"testing"
)

const (
	testUID = "8c4a7f3e-1b2c-4d5e-8f90-123456789abc"
	testCID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	// a static pod's UID is the kubelet's hash of its manifest
	staticUID = "6d1f0e5b9a7c4e3f8b2a1c0d9e8f7a6b"
)

func TestPodUID(t *testing.T) {
	u := strings.ReplaceAll(testUID, "-", "_")
	tests := []struct {
		name, path, uid, below string
	}{
		// cgroupfs driver (cgroup v2 path, or any v1 hierarchy's)
		{"cgroupfs burstable containerd", "/kubepods/burstable/pod" + testUID + "/" + testCID, testUID, testCID},
		{"cgroupfs besteffort cri-o", "/kubepods/besteffort/pod" + testUID + "/crio-" + testCID, testUID, "crio-" + testCID},
		{"cgroupfs guaranteed", "/kubepods/pod" + testUID + "/" + testCID, testUID, testCID},
		{"cgroupfs pause-less pod cgroup", "/kubepods/burstable/pod" + testUID, testUID, ""},
		// systemd driver
		{"systemd burstable containerd", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice/cri-containerd-" + testCID + ".scope", testUID, "cri-containerd-" + testCID + ".scope"},
		{"systemd besteffort cri-o", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + u + ".slice/crio-" + testCID + ".scope", testUID, "crio-" + testCID + ".scope"},
		{"systemd guaranteed docker", "/kubepods.slice/kubepods-pod" + u + ".slice/docker-" + testCID + ".scope", testUID, "docker-" + testCID + ".scope"},
		{"systemd cri-o with crun's container leaf", "/kubepods.slice/kubepods-pod" + u + ".slice/crio-" + testCID + ".scope/container", testUID, "crio-" + testCID + ".scope/container"},
		// nested: kind and other clusters in containers
		{"kind systemd", "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod" + u + ".slice/cri-containerd-" + testCID + ".scope", testUID, "cri-containerd-" + testCID + ".scope"},
		{"kind cgroupfs", "/kubelet/kubepods/besteffort/pod" + testUID + "/" + testCID, testUID, testCID},
		{"inside a docker container", "/docker/" + testCID + "/kubepods/burstable/pod" + testUID + "/" + testCID, testUID, testCID},
		{"static pod", "/kubepods/burstable/pod" + staticUID + "/" + testCID, staticUID, testCID},
		{"static pod systemd", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + staticUID + ".slice/cri-containerd-" + testCID + ".scope", staticUID, "cri-containerd-" + testCID + ".scope"},
		{"no trailing slash trimmed twice", "kubepods/pod" + testUID + "/", testUID, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			uid, below, ok := PodUID(tc.path)
			if !ok || uid != tc.uid || below != tc.below {
				t.Fatalf("PodUID(%q) = %q, %q, %v; want %q, %q, true", tc.path, uid, below, ok, tc.uid, tc.below)
			}
		})
	}
}

func TestPodUIDOutsidePods(t *testing.T) {
	u := strings.ReplaceAll(testUID, "-", "_")
	for _, path := range []string{
		"", "/", "/user.slice/user-1000.slice/session-3.scope", "/system.slice/vllm.service",
		"/docker/" + testCID,
		"/pod" + testUID + "/x",                                       // pod-looking name outside kubepods
		"/system.slice/x-pod" + u + ".slice",                          // systemd pod slice outside kubepods
		"/kubepods/burstable/pod" + strings.ToUpper(testUID),          // not how the kubelet spells it
		"/kubepods/burstable/pod" + testUID[:35],                      // one short
		"/kubepods/burstable/pod" + testUID + "0",                     // one long
		"/kubepods/burstable/pod8c4a7f3e_1b2c_4d5e_8f90_123456789abc", // systemd escaping in a cgroupfs name
		"/kubepods/burstable/pod" + staticUID[:31] + "g",
		"/kubepods.slice/kubepods-burstable.slice", // the QoS level, no pod
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod.slice",
	} {
		if uid, below, ok := PodUID(path); ok {
			t.Errorf("PodUID(%q) = %q, %q, true; want not a pod", path, uid, below)
		}
	}
}

func FuzzPodUID(f *testing.F) {
	f.Add("/kubepods/burstable/pod" + testUID + "/" + testCID)
	f.Add("/kubepods.slice/kubepods-pod" + strings.ReplaceAll(testUID, "-", "_") + ".slice/crio-x.scope")
	f.Add("/kubepods/pod" + staticUID)
	f.Add("\xff/kubepods-/pod")
	f.Fuzz(func(t *testing.T, path string) {
		uid, below, ok := PodUID(path)
		if !ok {
			if uid != "" || below != "" {
				t.Fatalf("not a pod but uid %q below %q", uid, below)
			}
			return
		}
		if !validUID(uid) {
			t.Fatalf("PodUID(%q) returned invalid uid %q", path, uid)
		}
		if !strings.HasSuffix(strings.Trim(path, "/"), below) {
			t.Fatalf("below %q is not the end of %q", below, path)
		}
	})
}
