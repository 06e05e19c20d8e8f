package procfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tree builds root/proc/PID with the given files and links in a temp dir
// and returns root.
func tree(t *testing.T, pid int, files map[string]string, links map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "proc", strconv.Itoa(pid))
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

// child starts a process that sleeps until the test ends, with env.
func child(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Until it has exec'd, the child shows this process's name and
	// environment; the exec takes the new name before it sets out the new
	// environment, which reads empty until then.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
		if string(comm) == "sleep\n" && len(environ) > 0 {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatal("sleep did not start within 10s")
		}
	}
}

func TestSelf(t *testing.T) {
	p := New("/")
	pid := os.Getpid()
	s, err := p.Stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != pid || s.PPID != os.Getppid() || s.StartTime == 0 || !strings.ContainsRune("RS", rune(s.State)) {
		t.Fatalf("stat %+v", s)
	}
	if comm, err := p.Comm(pid); err != nil || comm != s.Comm {
		t.Fatalf("comm %q %v, stat says %q", comm, err, s.Comm)
	}
	if start, err := p.StartTime(pid); err != nil || start != s.StartTime {
		t.Fatalf("start time %d %v, stat says %d", start, err, s.StartTime)
	}
	st, err := p.Status(pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tgid != pid || st.PPID != os.Getppid() || st.UID[0] != uint32(os.Getuid()) || st.UID[1] != uint32(os.Geteuid()) ||
		st.GID[0] != uint32(os.Getgid()) || st.Has != HasUID|HasGID|HasCapEff || st.State != s.State && st.State != 'R' && s.State != 'R' {
		t.Fatalf("status %+v", st)
	}
	exe, err := p.Exe(pid)
	if self, _ := os.Executable(); err != nil || exe != self {
		t.Fatalf("exe %q %v, want %q", exe, err, self)
	}
	args, err := p.Cmdline(pid, 0)
	if err != nil || !slices.Equal(args, os.Args) {
		t.Fatalf("cmdline %q %v, want %q", args, err, os.Args)
	}
	// The start time, converted, is in the past of the boot clock.
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &now); err != nil {
		t.Fatal(err)
	}
	if ns := p.TicksToNS(s.StartTime); ns == 0 || ns > uint64(now.Nano()) || p.ClockTick() == 0 {
		t.Fatalf("start %d ticks = %d ns at %d ticks/s, boot clock now %d ns", s.StartTime, ns, p.ClockTick(), now.Nano())
	}
}

func TestTicksToNS(t *testing.T) {
	f := At("/proc")
	f.hz.Store(100)
	for ticks, want := range map[uint64]uint64{0: 0, 1: 10e6, 250: 2500e6, 1<<40 + 7: (1<<40 + 7) * 10e6} {
		if got := f.TicksToNS(ticks); got != want {
			t.Errorf("%d ticks: %d ns, want %d", ticks, got, want)
		}
	}
}

// TestKeyTellsReuse checks that a process's key names it alone: a gone
// process is ErrGone, never a zero key that could match another.
func TestKeyTellsReuse(t *testing.T) {
	p := At("/proc")
	cmd := child(t)
	s, err := p.Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if s.Comm != "sleep" || s.PPID != os.Getpid() {
		t.Fatalf("child stat %+v", s)
	}
	if self, _ := p.Stat(os.Getpid()); self.Key() == s.Key() || self.StartTime > s.StartTime {
		t.Fatalf("keys %+v and %+v", self.Key(), s.Key())
	}
	cmd.Process.Kill()
	cmd.Wait()
	for _, read := range []func() error{
		func() error { _, err := p.Stat(s.PID); return err },
		func() error { _, err := p.StartTime(s.PID); return err },
		func() error { _, err := p.Status(s.PID); return err },
		func() error { _, err := p.Environ(s.PID, EnvFilter{Prefix: "A"}); return err },
		func() error { return p.Maps(s.PID, func(Mapping) bool { return true }) },
	} {
		err := read()
		if !errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "process "+strconv.Itoa(s.PID)+": /proc/"+strconv.Itoa(s.PID)+"/") ||
			!strings.Contains(err.Error(), "exited") {
			t.Errorf("after exit: %v, want ErrGone naming the pid and file", err)
		}
	}
}

func TestErrors(t *testing.T) {
	root := tree(t, 9, map[string]string{"stat": "garbage", "status": "Uid:\t1\t2\n"}, nil)
	p := New(root)
	_, err := p.Stat(9)
	var pe *ParseError
	if !errors.As(err, &pe) || errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "process 9: "+filepath.Join(root, "proc/9/stat")+": stat: no (comm) field") {
		t.Errorf("bad stat: %v", err)
	}
	if _, err := p.Status(9); !errors.As(err, &pe) || !strings.Contains(err.Error(), "want 4 ids") {
		t.Errorf("bad status: %v", err)
	}
	if _, err := p.Comm(10); !errors.Is(err, ErrGone) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing process: %v", err)
	}
	// Denied reads name the capability that allows them, and are not
	// mistaken for a gone process.
	for file, want := range map[string]string{
		"/proc/5/environ":             "CAP_SYS_PTRACE",
		"/proc/5/exe":                 "CAP_SYS_PTRACE",
		"/proc/5/map_files/1000-2000": "CAP_CHECKPOINT_RESTORE",
		"/proc/5/status":              "hidepid",
	} {
		err := error(&Error{PID: 5, File: file, Err: syscall.EACCES})
		if !errors.Is(err, fs.ErrPermission) || errors.Is(err, ErrGone) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s denied: %v, want it to name %s", file, err, want)
		}
	}
	if err := error(&Error{PID: 5, File: "/proc/5/cmdline", Err: syscall.ESRCH}); !errors.Is(err, ErrGone) {
		t.Errorf("ESRCH: %v is not ErrGone", err)
	}
	if _, err := New(root).PIDs(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(t.TempDir()).PIDs(); err == nil || !strings.Contains(err.Error(), "is procfs mounted there?") {
		t.Errorf("no procfs: %v", err)
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		in   string
		want Stat
		err  string
	}{
		{"4242 (python3) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2 3\n", Stat{4242, "python3", 'S', 1, 987654}, ""},
		{"4242 (a) b) (c) R 7 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 55 1\n", Stat{4242, "a) b) (c", 'R', 7, 55}, ""},
		{"4242 (with space) Z 0 1 2", Stat{4242, "with space", 'Z', 0, 0}, ""},
		{"4242 () S 1 2", Stat{4242, "", 'S', 1, 0}, ""},
		{"4242 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -5 1", Stat{}, `starttime: "-5" is not a number`},
		{"4242 (short) S", Stat{}, "1 fields after comm"},
		{"4242 (x) SS 1", Stat{}, "not a one-letter state"},
		{"4242 (x) S -1", Stat{}, `ppid: "-1" is not a process id`},
		{"(x) S 1", Stat{}, "is not a process id"},
		{"no paren", Stat{}, "no (comm) field"},
		{"42 (x", Stat{}, "no (comm) field"},
		{"42 )x( S 1", Stat{}, "no (comm) field"},
	}
	for _, tc := range tests {
		got, err := ParseStat([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %+v %v, want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseStatus(t *testing.T) {
	s, err := ParseStatus([]byte("Name:\tpy thon\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nNgid:\t0\nPid:\t43\nPPid:\t1\n" +
		"Uid:\t1000\t1001\t1002\t1003\nGid:\t100\t101\t102\t103\nCapEff:\t000001ffffffffff\n"))
	want := Status{Name: "py thon", State: 'S', Tgid: 42, PPID: 1, UID: [4]uint32{1000, 1001, 1002, 1003},
		GID: [4]uint32{100, 101, 102, 103}, CapEff: 0x1ffffffffff, Has: HasUID | HasGID | HasCapEff}
	if err != nil || s != want {
		t.Fatalf("%+v %v\nwant %+v", s, err, want)
	}
	if s, err := ParseStatus([]byte("Name:\tx\nTgid:\t7")); err != nil || s.Tgid != 7 || s.Has != 0 {
		t.Fatalf("no ids: %+v %v", s, err)
	}
	for in, want := range map[string]string{
		"Uid:\t1\t2\t3":           "want 4 ids",
		"Uid:\t1\t2\t3\tx":        `"x" is not an id`,
		"Gid:\t1\t2\t3\t4\t5":     "want 4 ids",
		"Tgid:\tx":                "Tgid",
		"PPid:\t-3":               "PPid",
		"CapEff:\tzz":             "hexadecimal",
		"State:\t\nUid:\t0 0 0 0": "State",
	} {
		if _, err := ParseStatus([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %q", in, err, want)
		}
	}
}

func TestUID(t *testing.T) {
	root := tree(t, 3, map[string]string{"status": "Name:\tx\nUid:\t10\t20\t30\t40\n"}, nil)
	if r, e, err := New(root).UID(3); err != nil || r != 10 || e != 20 {
		t.Fatalf("%d %d %v", r, e, err)
	}
	root = tree(t, 3, map[string]string{"status": "Name:\tx\n"}, nil)
	if _, _, err := New(root).UID(3); err == nil || !strings.Contains(err.Error(), "no Uid line") {
		t.Fatalf("no Uid line: %v", err)
	}
}

func TestFilesOfATree(t *testing.T) {
	root := tree(t, 4242, map[string]string{
		"comm":    "py (thon)\n",
		"cmdline": "python3\x00-m\x00vllm\x00\x00",
		"cgroup":  "12:cpu,cpuacct:/batch.slice/job.service\n1:name=systemd:/other\n",
	}, map[string]string{"exe": "/usr/bin/python3.12", "fd/0": "/dev/null", "fd/3": "/dev/nvidia0"})
	p := New(root)
	if c, err := p.Comm(4242); err != nil || c != "py (thon)" {
		t.Errorf("comm %q %v", c, err)
	}
	if a, err := p.Cmdline(4242, 0); err != nil || !slices.Equal(a, []string{"python3", "-m", "vllm"}) {
		t.Errorf("cmdline %q %v", a, err)
	}
	if a, err := p.Cmdline(4242, 9); err != nil || !slices.Equal(a, []string{"python3", "-"}) {
		t.Errorf("cmdline cut at 9 bytes: %q %v", a, err)
	}
	if e, err := p.Exe(4242); err != nil || e != "/usr/bin/python3.12" {
		t.Errorf("exe %q %v", e, err)
	}
	if c, err := p.Cgroup(4242); err != nil || c != "/batch.slice/job.service" {
		t.Errorf("cgroup %q %v", c, err)
	}
	fds, err := p.FDTargets(4242, 0)
	slices.Sort(fds)
	if err != nil || !slices.Equal(fds, []string{"/dev/null", "/dev/nvidia0"}) {
		t.Errorf("fds %q %v", fds, err)
	}
	if fds, err := p.FDTargets(4242, 1); err != nil || len(fds) != 1 {
		t.Errorf("fds bounded to 1: %q %v", fds, err)
	}
	if got := p.Root(4242, "/etc/passwd"); got != filepath.Join(root, "proc/4242/root/etc/passwd") {
		t.Errorf("root path %s", got)
	}
	if pids, err := p.PIDs(); err != nil || !slices.Equal(pids, []int{4242}) {
		t.Errorf("pids %v %v", pids, err)
	}
}

func TestCgroupPath(t *testing.T) {
	for in, want := range map[string]string{
		"0::/a.slice/b.service\n":                       "/a.slice/b.service",
		"12:cpu,cpuacct:/x\n1:name=systemd:/y\n0::/z\n": "/z",
		"12:cpu,cpuacct:/x\n1:name=systemd:/y\n":        "/x",
		"3:memory:/m\n1:name=systemd:/y\n":              "/y",
		"3:memory:/m\n4:pids:/p\n":                      "/m",
		"garbage\n":                                     "",
		"":                                              "",
	} {
		if got := CgroupPath([]byte(in)); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func TestEnviron(t *testing.T) {
	// A live process: only the allowed variables come back.
	cmd := child(t, "PATH=/bin", "ARBITER_CLASS=latency-critical", "ARBITER_SLO_MS=25", "ARBITERX=1", "SECRET=s3cr3t", "CUDA_VISIBLE_DEVICES=0")
	env, err := At("/proc").Environ(cmd.Process.Pid, EnvFilter{Prefix: "ARBITER_", Names: []string{"CUDA_VISIBLE_DEVICES"}})
	want := map[string]string{"ARBITER_CLASS": "latency-critical", "ARBITER_SLO_MS": "25", "CUDA_VISIBLE_DEVICES": "0"}
	if err != nil || !equalMaps(env, want) {
		t.Fatalf("%v %v, want %v", env, err, want)
	}

	// Bounds: variables longer than the read buffer, the number kept, the
	// value length, and a read cut mid-variable.
	var b strings.Builder
	b.WriteString("HUGE=" + strings.Repeat("h", 100_000) + "\x00")
	for i := range 200 {
		b.WriteString("ARBITER_V" + strings.Repeat("x", i) + "=" + strings.Repeat("v", 5000) + "\x00")
	}
	root := tree(t, 7, map[string]string{"environ": b.String()}, nil)
	env, err = New(root).Environ(7, EnvFilter{Prefix: "ARBITER_", MaxBytes: 1 << 20})
	if err != nil || len(env) != 64 {
		t.Fatalf("%d vars kept (%v), want 64", len(env), err)
	}
	for k, v := range env {
		if len(v) != 1024 || strings.Trim(v, "v") != "" || !strings.HasPrefix(k, "ARBITER_V") {
			t.Fatalf("%s has %d bytes", k, len(v))
		}
	}
	root = tree(t, 7, map[string]string{"environ": "ARBITER_A=1\x00ARBITER_B=cut here"}, nil)
	env, err = New(root).Environ(7, EnvFilter{Prefix: "ARBITER_", MaxBytes: 23})
	if err != nil || !equalMaps(env, map[string]string{"ARBITER_A": "1", "ARBITER_B": "c"}) {
		t.Fatalf("cut read: %v %v", env, err)
	}
	root = tree(t, 7, map[string]string{"environ": "A=1\x00B=2\x00"}, nil)
	if env, err = New(root).Environ(7, EnvFilter{Prefix: "ARBITER_"}); err != nil || env != nil {
		t.Fatalf("none allowed: %v %v", env, err)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestMapsSelf(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(self, &st); err != nil {
		t.Fatal(err)
	}
	p := At("/proc")
	var found Mapping
	if err := p.Maps(os.Getpid(), func(m Mapping) bool {
		if m.Path == self {
			found = m
			return false
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if found.Inode != st.Ino || found.Dev != uint64(st.Dev) || found.Start >= found.End || found.Deleted {
		t.Fatalf("mapping of %s: %+v, stat says dev %#x inode %d", self, found, st.Dev, st.Ino)
	}
	// Its map_files entry opens the same file.
	var mst syscall.Stat_t
	if err := syscall.Stat(p.MapFile(os.Getpid(), found), &mst); err != nil || mst.Ino != st.Ino {
		t.Fatalf("map_files entry: %v, inode %d", err, mst.Ino)
	}
}

func TestParseMapsLine(t *testing.T) {
	tests := []struct {
		line string
		ok   bool
		want Mapping
	}{
		{"7f12a000-7f12b000 r-xp 00001000 fd:01 123456    /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", true,
			Mapping{Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", Dev: Mkdev(0xfd, 1), Inode: 123456,
				Start: 0x7f12a000, End: 0x7f12b000, Offset: 0x1000}},
		{"7f12a000-7f12b000 r--p 00000000 103:02 42 /opt/my libs/libcuda.so.1 (deleted)", true,
			Mapping{Path: "/opt/my libs/libcuda.so.1", Dev: Mkdev(0x103, 2), Inode: 42,
				Start: 0x7f12a000, End: 0x7f12b000, Deleted: true}},
		{"7ffd1000-7ffd2000 rw-p 00000000 00:00 0 [stack]", false, Mapping{}},
		{"55d0-55d1 rw-p 00000000 00:00 0", false, Mapping{}},
		{"55d0-55d1 r-xp 00000000 zz:01 7 /lib/libcuda.so", false, Mapping{}},
		{"garbage", false, Mapping{}},
		{"7f12b000-7f12a000 r-xp 00000000 fd:01 7 /lib/libcuda.so", false, Mapping{}},
		{"7f12a000-7f12b000 r-xp 0000zz00 fd:01 7 /lib/libcuda.so", false, Mapping{}},
	}
	for _, tc := range tests {
		got, ok := ParseMapsLine(tc.line)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%q: got %+v %v, want %+v %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func TestMkdevMatchesStat(t *testing.T) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		t.Fatal(err)
	}
	maj, min := uint64(st.Dev>>8&0xfff|st.Dev>>32&^0xfff), uint64(st.Dev&0xff|st.Dev>>12&^0xff)
	if Mkdev(maj, min) != uint64(st.Dev) {
		t.Errorf("Mkdev(%d, %d) = %#x, stat says %#x", maj, min, Mkdev(maj, min), st.Dev)
	}
}

func BenchmarkStartTime(b *testing.B) {
	p, pid := At("/proc"), os.Getpid()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.StartTime(pid); err != nil {
			b.Fatal(err)
		}
	}
}
