package input

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpu-arbiter/arbiter/procfs"
)

func TestParseCgroup(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const uid = "8c4a7f3e-1b2c-4d5e-8f90-123456789abc"
	uidU := strings.ReplaceAll(uid, "-", "_")
	tests := []struct {
		path string
		want Cgroup
	}{
		{"/user.slice/user-1000.slice/session-3.scope", Cgroup{Slice: "user-1000.slice", Unit: "session-3.scope"}},
		{"/system.slice/vllm.service", Cgroup{Slice: "system.slice", Unit: "vllm.service"}},
		{"/inference.slice/triton.service", Cgroup{Slice: "inference.slice", Unit: "triton.service"}},
		{"/docker/" + id, Cgroup{ContainerID: id, Runtime: "docker"}},
		{"/system.slice/docker-" + id + ".scope", Cgroup{Slice: "system.slice", Unit: "docker-" + id + ".scope", ContainerID: id, Runtime: "docker"}},
		{"/machine.slice/libpod-" + id + ".scope", Cgroup{Slice: "machine.slice", Unit: "libpod-" + id + ".scope", ContainerID: id, Runtime: "podman"}},
		{"/libpod_parent/" + id, Cgroup{ContainerID: id, Runtime: "podman"}},
		// kubelet, cgroupfs driver (containerd / cri-o)
		{"/kubepods/burstable/pod" + uid + "/" + id, Cgroup{ContainerID: id, Runtime: "containerd", PodUID: uid, QoS: "burstable"}},
		{"/kubepods/pod" + uid + "/" + id, Cgroup{ContainerID: id, Runtime: "containerd", PodUID: uid, QoS: "guaranteed"}},
		{"/kubepods/besteffort/pod" + uid + "/crio-" + id, Cgroup{ContainerID: id, Runtime: "cri-o", PodUID: uid, QoS: "besteffort"}},
		// kubelet, systemd driver
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + id + ".scope",
			Cgroup{Slice: "kubepods-burstable-pod" + uidU + ".slice", Unit: "cri-containerd-" + id + ".scope", ContainerID: id, Runtime: "containerd", PodUID: uid, QoS: "burstable"}},
		{"/kubepods.slice/kubepods-pod" + uidU + ".slice/crio-" + id + ".scope",
			Cgroup{Slice: "kubepods-pod" + uidU + ".slice", Unit: "crio-" + id + ".scope", ContainerID: id, Runtime: "cri-o", PodUID: uid, QoS: "guaranteed"}},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/docker-" + id + ".scope",
			Cgroup{Slice: "kubepods-besteffort-pod" + uidU + ".slice", Unit: "docker-" + id + ".scope", ContainerID: id, Runtime: "docker", PodUID: uid, QoS: "besteffort"}},
		// not containers
		{"/", Cgroup{}},
		{"", Cgroup{}},
		{"/pod" + uid + "/x", Cgroup{}}, // pod-looking name outside kubepods
		{"/docker/short", Cgroup{}},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/crio-conmon-" + id + ".scope",
			Cgroup{Slice: "kubepods-burstable-pod" + uidU + ".slice", Unit: "crio-conmon-" + id + ".scope", PodUID: uid, QoS: "burstable"}},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			tc.want.Path = tc.path
			if got := ParseCgroup(tc.path); got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseCgroup(f *testing.F) {
	for _, s := range []string{"/", "/kubepods/burstable/pod8c4a7f3e-1b2c-4d5e-8f90-123456789abc/x", "/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope", "\xff/a.slice"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		c := ParseCgroup(path)
		if c.Path != path {
			t.Fatalf("path %q changed to %q", path, c.Path)
		}
		if c.ContainerID != "" && len(c.ContainerID) != 64 {
			t.Fatalf("container id %q", c.ContainerID)
		}
		if c.PodUID != "" && len(c.PodUID) != 36 {
			t.Fatalf("pod uid %q", c.PodUID)
		}
	})
}

// fakeProc builds /proc/PID in a temp dir.
func fakeProc(t *testing.T, pid string, files map[string]string, links map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, pid)
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestReadProcess(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const uid = "8c4a7f3e-1b2c-4d5e-8f90-123456789abc"
	cg := "/kubepods/burstable/pod" + uid + "/" + id
	root := fakeProc(t, "4242", map[string]string{
		"stat":    "4242 (py (\xffthon)) S 17 4242 4242 0 -1 4194560",
		"comm":    "py (\xffthon)\n",
		"cmdline": "python3\x00-m\x00vllm.entrypoints\x00--model=\xfe\xffx\x00",
		"status":  "Name:\tpython3\nUid:\t1001\t1001\t1001\t1001\nGid:\t100\t100\t100\t100\n",
		"cgroup":  "0::" + cg + "\n",
		"environ": "PATH=/bin\x00ARBITER_CLASS=latency-critical\x00ARBITER_SLO_MS=25\x00ARBITERX=1\x00HOME=/root\x00ARBITER_BAD=\xff\x00",
	}, map[string]string{
		"exe": "/usr/bin/python3.12", "fd/0": "/dev/null", "fd/3": "/dev/nvidiactl", "fd/4": "/dev/nvidia1",
		"fd/5": "/dev/nvidia0", "fd/6": "/dev/nvidia1", "fd/7": "/dev/nvidia-uvm",
	})
	passwd := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(passwd, []byte("root:x:0:0::/root:/bin/sh\nalice:x:1001:100::/home/alice:/bin/sh\n"), 0o644)
	p, err := ReadProcess(procfs.At(root), 4242, &Options{Passwd: passwd, Pod: func(u string) (Pod, bool) {
		return Pod{Namespace: "inference", Name: "vllm-0", Labels: map[string]string{"app": "vllm"}}, u == uid
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := Process{
		PID: 4242, PPID: 17, Comm: "py (\uFFFDthon)", Exe: "/usr/bin/python3.12",
		Cmdline: []string{"python3", "-m", "vllm.entrypoints", "--model=\uFFFDx"}, UID: 1001, User: "alice",
		Cgroup: Cgroup{Path: cg, ContainerID: id, Runtime: "containerd", PodUID: uid, QoS: "burstable"},
		Pod:    &Pod{UID: uid, Namespace: "inference", Name: "vllm-0", Labels: map[string]string{"app": "vllm"}},
		Env:    map[string]string{"ARBITER_CLASS": "latency-critical", "ARBITER_SLO_MS": "25", "ARBITER_BAD": "\uFFFD"},
		GPUs:   []int{0, 1},
	}
	if !equalJSON(t, p, want) {
		t.Fatal("process differs")
	}
}

func TestReadProcessBounds(t *testing.T) {
	var env strings.Builder
	for i := range 200 {
		env.WriteString("ARBITER_V" + strings.Repeat("x", i) + "=" + strings.Repeat("v", 5000) + "\x00")
	}
	root := fakeProc(t, "7", map[string]string{
		"stat":    "7 (x) S 1 7",
		"cgroup":  "12:cpu,cpuacct:/batch.slice/job.service\n1:name=systemd:/other\n",
		"environ": env.String(),
	}, nil)
	p, err := ReadProcess(procfs.At(root), 7, &Options{Passwd: "/nonexistent", MaxEnvBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Env) != 64 {
		t.Fatalf("%d env vars kept, want 64", len(p.Env))
	}
	for k, v := range p.Env {
		if len(v) != 1024 {
			t.Fatalf("%s has %d bytes, want 1024", k, len(v))
		}
	}
	if p.Comm != "x" || p.PPID != 1 || p.User != "" || p.Cgroup.Slice != "batch.slice" || p.Cgroup.Unit != "job.service" || p.GPUs != nil {
		t.Fatalf("%+v", p)
	}
}

func TestReadProcessContainerUser(t *testing.T) {
	root := fakeProc(t, "8", map[string]string{"stat": "8 (x) S 1 8", "status": "Uid:\t4242\t4242\t4242\t4242\n"}, nil)
	if err := os.MkdirAll(filepath.Join(root, "8", "root", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "8", "root", "etc", "passwd"), []byte("svc:x:4242:4242::/:/bin/false\n"), 0o644)
	node := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(node, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644)
	p, err := ReadProcess(procfs.At(root), 8, &Options{Passwd: node})
	if err != nil || p.UID != 4242 || p.User != "svc" {
		t.Fatalf("%+v %v", p, err)
	}
}

func TestReadProcessErrors(t *testing.T) {
	if _, err := ReadProcess(procfs.At(t.TempDir()), 1, nil); !errors.Is(err, procfs.ErrGone) || !strings.Contains(err.Error(), "process 1:") {
		t.Fatalf("missing process: %v", err)
	}
	root := fakeProc(t, "9", map[string]string{"stat": "garbage"}, nil)
	if _, err := ReadProcess(procfs.At(root), 9, nil); err == nil || !strings.Contains(err.Error(), "no (comm) field") {
		t.Fatalf("bad stat: %v", err)
	}
}

func TestReadProcessSelf(t *testing.T) {
	p, err := ReadProcess(procfs.At("/proc"), os.Getpid(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != os.Getpid() || p.PPID != os.Getppid() || p.Comm == "" || p.Exe == "" || len(p.Cmdline) == 0 || p.UID != os.Getuid() {
		t.Fatalf("%+v", p)
	}
}

// FuzzReadProcess builds a process from arbitrary status, cgroup and
// environ files: whatever they hold, the input is valid UTF-8 and keeps
// only bounded, allowed variables.
func FuzzReadProcess(f *testing.F) {
	f.Add([]byte("Uid:\t1000\t1000\t1000\t1000\n"), []byte("0::/a.slice/b.service\n"), []byte("ARBITER_A=1\x00B=2\x00"))
	f.Add([]byte("Uid:"), []byte("1:cpu,cpuacct:/x\n2:name=systemd:/y"), []byte("\x00\x00ARBITER_=\xff"))
	root := f.TempDir()
	dir := filepath.Join(root, "5")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte("5 (x) S 1 5"), 0o644); err != nil {
		f.Fatal(err)
	}
	o := (*Options)(nil).withDefaults()
	o.MaxEnvVars, o.MaxEnvValue = 4, 8
	f.Fuzz(func(t *testing.T, status, cgroup, environ []byte) {
		for name, b := range map[string][]byte{"status": status, "cgroup": cgroup, "environ": environ} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		p, err := ReadProcess(procfs.At(root), 5, &o)
		if err != nil {
			t.Fatal(err)
		}
		if p.UID < 0 || len(p.Env) > o.MaxEnvVars {
			t.Fatalf("%+v", p)
		}
		for k, v := range p.Env {
			if !strings.HasPrefix(k, "ARBITER_") || len(v) > 3*o.MaxEnvValue {
				t.Fatalf("%q=%q", k, v)
			}
		}
		b, err := json.Marshal(p)
		if err != nil || !utf8.Valid(b) {
			t.Fatalf("%+v: %v", p, err)
		}
	})
}

// equalJSON compares two values by their JSON encoding.
func equalJSON(t testing.TB, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(ja) != string(jb) {
		t.Logf("got  %s\nwant %s", ja, jb)
		return false
	}
	return true
}
