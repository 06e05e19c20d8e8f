package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestMain lets tests run the real main (exit codes included) by
// re-executing the test binary with ARBITER_TEST_MAIN=1, and runs the
// tests, as root, in a mount namespace without tracefs or debugfs: the
// commands must attach without them.
func TestMain(m *testing.M) {
	if os.Getenv("ARBITER_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(testenv.MainWithoutTracefs(m))
}

func comm16(s string) (c [16]byte) {
	copy(c[:], s)
	return c
}

// replayEvents: infer (pid 100, cgroup 5) runs two requests 10 ms apart,
// train (pid 200, cgroup 6, exec not seen) launches, an unrelated shell
// starts and exits.
func replayEvents() []trace.Event {
	const ms = 1_000_000
	base := uint64(5_000 * ms)
	return []trace.Event{
		{Kind: trace.KindExec, PID: 100, TID: 100, Time: base, Cgroup: 5, Proc: trace.Proc{PPID: 1, Comm: comm16("infer")}},
		{Kind: trace.KindCopy, Func: trace.FuncMemcpyHtoDAsyncV2, PID: 100, TID: 100, Time: base + 1*ms, Cgroup: 5,
			Copy: trace.Copy{Dir: trace.CopyHtoD, Bytes: 1 << 20, Device: 0x302000000, Host: 0x7f0000001000, Stream: 0x55}},
		{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: 100, TID: 100, Time: base + 1*ms + 20_000, Cgroup: 5,
			Launch: trace.Launch{Function: 0xf00, Stream: 0x55, Grid: [3]uint32{64, 1, 1}, Block: [3]uint32{256, 1, 1}}},
		{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: 200, TID: 201, Time: base + 1*ms + 30_000, Cgroup: 6,
			Launch: trace.Launch{Function: 0xbee, Stream: 0x66, Grid: [3]uint32{1024, 1, 1}, Block: [3]uint32{512, 1, 1}, SharedMem: 49152}},
		{Kind: trace.KindSync, Func: trace.FuncStreamSynchronize, PID: 100, TID: 100, Time: base + 1*ms + 40_000, Cgroup: 5,
			Sync: trace.Sync{Handle: 0x55, Duration: 960_000}},
		{Kind: trace.KindCopy, Func: trace.FuncMemcpyDtoHV2, PID: 100, TID: 100, Time: base + 11*ms, Cgroup: 5,
			Copy: trace.Copy{Dir: trace.CopyDtoH, Bytes: 4096, Device: 0x302000000, Host: 0x7f0000001000}},
		{Kind: trace.KindSync, Func: trace.FuncEventRecord, PID: 200, TID: 200, Time: base + 12*ms, Cgroup: 6,
			Sync: trace.Sync{Handle: 0xe0, Other: 0x66, Duration: 3_000, Result: 400}},
		{Kind: trace.KindExec, PID: 300, TID: 300, Time: base + 13*ms, Cgroup: 5, Proc: trace.Proc{PPID: 1, Comm: comm16("sh")}},
		{Kind: trace.KindExit, PID: 300, TID: 300, Time: base + 14*ms, Cgroup: 5, Proc: trace.Proc{Comm: comm16("sh"), ExitCode: 2}},
		{Kind: trace.KindExit, PID: 100, TID: 100, Time: base + 20*ms, Cgroup: 5, Proc: trace.Proc{Comm: comm16("infer")}},
	}
}

func writeReplay(t *testing.T, evs []trace.Event) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "replay.arbt")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.NewWriter(f, trace.Header{Host: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		if err := w.Write(&evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCmd runs `arbiter args...` in process and returns stdout, stderr and
// the error.
func runCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := newRootCmd("test")
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return stdout.String(), stderr.String(), err
}

const wantText = `    0.000000 100/100       infer           exec   ppid=1
    0.001000 100/100       infer           copy   cuMemcpyHtoDAsync_v2 htod bytes=1048576 dev=0x302000000 host=0x7f0000001000 stream=0x55
    0.001020 100/100       infer           launch cuLaunchKernel fn=0xf00 stream=0x55 grid=64x1x1 block=256x1x1 smem=0
    0.001030 200/201       -               launch cuLaunchKernel fn=0xbee stream=0x66 grid=1024x1x1 block=512x1x1 smem=49152
    0.001040 100/100       infer           sync   cuStreamSynchronize handle=0x55 took=960µs result=CUDA_SUCCESS
    0.011000 100/100       infer           copy   cuMemcpyDtoH_v2 dtoh bytes=4096 dev=0x302000000 host=0x7f0000001000 stream=0x0
    0.012000 200/200       -               sync   cuEventRecord handle=0xe0 other=0x66 took=3µs result=CUDA_ERROR_INVALID_HANDLE
    0.020000 100/100       infer           exit   code=0
`

// wantSummary, by hand: infer (100) is active from its copy at 1 ms to its
// copy at 11 ms (10 ms: too short for a rate) with an idle 9 ms between:
// two requests. Pid 200 from its launch at 1.03 ms to its sync's return at
// 12.003 ms (10.973 ms), also two requests, one failed sync. The shell
// (300) made no driver call: counted, not shown, in one process's words.
const wantSummary = `
2 CUDA processes (requests are busy periods separated by 2ms idle); 1 other process started or exited
  PID   COMM  LAUNCHES  LAUNCHES/S  COPIES   COPIED  REQUESTS  SYNCS  SYNC TIME  MAX SYNC  SYNC ERRORS   ACTIVE  EXIT
  100  infer         1         n/a       2  1.0 MiB         2      1      960µs     960µs            0     10ms     0
  200      -         1         n/a       0      0 B         2      1        3µs       3µs            1  10.97ms     -
launches/s is n/a for a process active less than 1s: too short for a rate
`

func TestTraceReplayText(t *testing.T) {
	path := writeReplay(t, replayEvents())
	stdout, stderr, err := runCmd(t, "trace", "--replay", path)
	if err != nil {
		t.Fatal(err)
	}
	if stdout != wantText {
		t.Errorf("stdout:\n%s\nwant:\n%s", stdout, wantText)
	}
	if stderr != wantSummary {
		t.Errorf("stderr:\n%q\nwant:\n%q", stderr, wantSummary)
	}
}

// TestTraceReplayNoMatch: a replay whose --pid matches none of the file's
// processes says so and names those it holds, where a filter that
// matches says nothing of it.
func TestTraceReplayNoMatch(t *testing.T) {
	path := writeReplay(t, replayEvents())
	_, stderr, err := runCmd(t, "trace", "--replay", path, "--pid", "4242")
	if err != nil {
		t.Fatal(err)
	}
	if want := "warning: no event of the replay passed --pid, --cgroup or --comm; the file holds events of processes 100 (infer), 200, 300"; !strings.Contains(stderr, want) {
		t.Errorf("stderr:\n%s\nwant %q", stderr, want)
	}
	if _, stderr, err = runCmd(t, "trace", "--replay", path, "--pid", "100"); err != nil || strings.Contains(stderr, "warning") {
		t.Errorf("a filter that matches: %v, stderr:\n%s", err, stderr)
	}
}

func TestTraceReplayJSON(t *testing.T) {
	path := writeReplay(t, replayEvents()[:8])
	stdout, _, err := runCmd(t, "trace", "--replay", path, "--format", "json", "--pid", "100", "--pid", "200")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"time_ns":5000000000,"kind":"exec","pid":100,"tid":100,"cgroup":5,"comm":"infer","ppid":1,"exit_code":0}
{"time_ns":5001000000,"kind":"copy","func":"cuMemcpyHtoDAsync_v2","pid":100,"tid":100,"cgroup":5,"comm":"infer","stream":"0x55","dir":"htod","bytes":1048576,"device":"0x302000000","host":"0x7f0000001000"}
{"time_ns":5001020000,"kind":"launch","func":"cuLaunchKernel","pid":100,"tid":100,"cgroup":5,"comm":"infer","function":"0xf00","grid":[64,1,1],"block":[256,1,1],"shared_mem":0,"stream":"0x55"}
{"time_ns":5001030000,"kind":"launch","func":"cuLaunchKernel","pid":200,"tid":201,"cgroup":6,"function":"0xbee","grid":[1024,1,1],"block":[512,1,1],"shared_mem":49152,"stream":"0x66"}
{"time_ns":5001040000,"kind":"sync","func":"cuStreamSynchronize","pid":100,"tid":100,"cgroup":5,"comm":"infer","handle":"0x55","other":"0x0","duration_ns":960000,"result":0,"result_name":"CUDA_SUCCESS"}
{"time_ns":5011000000,"kind":"copy","func":"cuMemcpyDtoH_v2","pid":100,"tid":100,"cgroup":5,"comm":"infer","stream":"0x0","dir":"dtoh","bytes":4096,"device":"0x302000000","host":"0x7f0000001000"}
{"time_ns":5012000000,"kind":"sync","func":"cuEventRecord","pid":200,"tid":200,"cgroup":6,"handle":"0xe0","other":"0x66","duration_ns":3000,"result":400,"result_name":"CUDA_ERROR_INVALID_HANDLE"}
`
	if stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", stdout, want)
	}
}

func TestTraceJSONRMEvent(t *testing.T) {
	path := writeReplay(t, []trace.Event{{Kind: trace.KindRMAlloc, PID: 9, TID: 9, Time: 1,
		RM: trace.RM{FD: 7, Client: 0xc1d00001, Parent: 0xcaf00000, Object: 0xcaf00001, Class: 0xa06c, EngineType: 1}}})
	stdout, _, err := runCmd(t, "trace", "--replay", path, "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"time_ns":1,"kind":"rm_alloc","pid":9,"tid":9,"cgroup":0,"fd":7,"status":0,"client":"0xc1d00001","parent":"0xcaf00000","object":"0xcaf00001","class":"0xa06c","engine_type":1,"cmd":"0x0","value":0}
`
	if stdout != want {
		t.Errorf("got  %s\nwant %s", stdout, want)
	}
}

// pidsOf returns the PIDs of the text output's lines, in order.
func pidsOf(out string) []string {
	var pids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			pids = append(pids, strings.Split(f[1], "/")[0])
		}
	}
	return pids
}

func TestTraceFilters(t *testing.T) {
	path := writeReplay(t, replayEvents())
	cgroupRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cgroupRoot, "kubepods.slice", "pod1"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"pid", []string{"--pid", "200"}, "200 200"},
		{"two pids", []string{"--pid", "200", "--pid", "300"}, "200 200 300 300"},
		{"comm", []string{"--comm", "infer"}, "100 100 100 100 100 100"},
		{"comm of a short-lived process", []string{"--comm", "sh"}, "300 300"},
		{"comm unknown without exec or procfs", []string{"--comm", "train"}, ""},
		{"cgroup id", []string{"--cgroup", "6"}, "200 200"},
		{"pid or cgroup", []string{"--cgroup", "6", "--pid", "300"}, "200 200 300 300"},
		{"cgroup and comm", []string{"--cgroup", "5", "--comm", "sh"}, "300 300"},
		{"duration in trace time", []string{"--duration", "1030us"}, "100 100 100 200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := runCmd(t, append([]string{"trace", "--replay", path}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(pidsOf(stdout), " "); got != tt.want {
				t.Errorf("pids %q, want %q\n%s", got, tt.want, stdout)
			}
		})
	}
}

func TestResolveCgroup(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "kubepods.slice", "pod1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{dir, "/kubepods.slice/pod1", "kubepods.slice/pod1"} {
		id, err := resolveCgroup(root, v)
		if err != nil || id != st.Ino {
			t.Errorf("resolveCgroup(%q) = %d, %v; want inode %d", v, id, err, st.Ino)
		}
	}
	if id, err := resolveCgroup(root, "12345"); err != nil || id != 12345 {
		t.Errorf("numeric id: %d, %v", id, err)
	}
	if _, err := resolveCgroup(root, "/nope"); err == nil || !strings.Contains(err.Error(), filepath.Join(root, "nope")) {
		t.Errorf("missing cgroup: %v, want an error naming the path", err)
	}
	if _, err := resolveCgroup(root, "0"); err == nil {
		t.Error("cgroup id 0 accepted")
	}
	if os.Getenv("ARBITER_SKIP_SYSFS") == "" {
		// On the real hierarchy the root cgroup's id is its inode, 1.
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
			id, err := resolveCgroup("/sys/fs/cgroup", "/")
			if err != nil || id != 1 {
				t.Errorf("root cgroup id = %d, %v; want 1", id, err)
			}
		}
	}
}

func TestTraceCorruptReplay(t *testing.T) {
	path := writeReplay(t, replayEvents())
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Cut the file inside its fourth record.
	r, err := trace.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var ev trace.Event
	for i := 0; i < 3; i++ {
		if err := r.Read(&ev); err != nil {
			t.Fatal(err)
		}
	}
	cut := r.Offset() + 3
	// The record's kind and length bytes are there; its payload, from
	// offset +2, is cut short.
	wantOff := r.Offset() + 2
	if err := os.WriteFile(path, data[:cut], 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := runCmd(t, "trace", "--replay", path)
	var fe *trace.FormatError
	if !errors.As(err, &fe) || fe.Offset != wantOff {
		t.Fatalf("err = %v, want a *trace.FormatError at offset %d", err, wantOff)
	}
	if want := "replay " + path + ": trace file: byte offset "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q does not start with %q", err, want)
	}
	if n := len(pidsOf(stdout)); n != 3 {
		t.Errorf("printed %d events before the error, want 3", n)
	}
	if !strings.Contains(stderr, "\n1 CUDA process (") {
		t.Errorf("no summary of what was read:\n%s", stderr)
	}

	// Through main: a non-zero exit and the message on stderr.
	code, out := runMain(t, "trace", "--replay", path)
	if code != 1 || !strings.Contains(out, "arbiter: replay "+path+": trace file: byte offset") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	code, out = runMain(t, "trace", "--replay", filepath.Join(t.TempDir(), "missing"))
	if code != 1 || !strings.Contains(out, "no such file") {
		t.Errorf("missing file: exit %d, output:\n%s", code, out)
	}
	if err := os.WriteFile(path, []byte("not a trace"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = runMain(t, "trace", "--replay", path)
	if code != 1 || !strings.Contains(out, "byte offset 0: not a trace file: magic \"not a tr\"") {
		t.Errorf("short file: exit %d, output:\n%s", code, out)
	}
}

// runMain runs the real main in a child process and returns its exit code
// and combined output.
func runMain(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// runArgv runs argv, whose command is the test binary re-executed into
// main (or one that runs it, as setpriv does), and returns its exit
// status, stdout and stderr apart.
func runArgv(t *testing.T, argv ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stdout.String(), stderr.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, stdout.String(), stderr.String()
}

func TestTraceRecordThenReplay(t *testing.T) {
	src := writeReplay(t, replayEvents())
	rec := filepath.Join(t.TempDir(), "filtered.arbt")
	if _, _, err := runCmd(t, "trace", "--replay", src, "--pid", "100", "--record", rec, "--quiet"); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := runCmd(t, "trace", "--replay", rec)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(pidsOf(stdout), " "); got != "100 100 100 100 100 100" {
		t.Errorf("recorded pids %q", got)
	}
	f, err := os.Open(rec)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if h := r.Header(); h.Created.IsZero() || h.Comment == "" {
		t.Errorf("recorded header %+v lacks time or command line", h)
	}
}

func TestTraceReplayNameRecords(t *testing.T) {
	// A recording of a process already running holds its name in a name
	// record: the replay shows it and --comm matches it.
	path := filepath.Join(t.TempDir(), "named.arbt")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.NewWriter(f, trace.Header{})
	if err != nil {
		t.Fatal(err)
	}
	evs := replayEvents()
	for i := range evs {
		if evs[i].PID == 200 && evs[i].Kind == trace.KindLaunch {
			if err := w.WriteName(200, "train"); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Write(&evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	stdout, stderr, err := runCmd(t, "trace", "--replay", path, "--comm", "train")
	if err != nil {
		t.Fatal(err)
	}
	want := `    0.001030 200/201       train           launch cuLaunchKernel fn=0xbee stream=0x66 grid=1024x1x1 block=512x1x1 smem=49152
    0.012000 200/200       train           sync   cuEventRecord handle=0xe0 other=0x66 took=3µs result=CUDA_ERROR_INVALID_HANDLE
`
	if stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", stdout, want)
	}
	if !strings.Contains(stderr, "  200  train ") {
		t.Errorf("summary lacks the name:\n%s", stderr)
	}
}

func TestTraceFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--format", "xml"}, `--format "xml": want text or json`},
		{[]string{"--pid", "0"}, `invalid argument "0" for "--pid" flag: 0 is not a process id`},
		{[]string{"--pid", "4294967296"}, "4294967296 is not a process id (a positive whole number below 2^32)"},
		{[]string{"--pid", "12,x"}, "x is not a process id"},
		{[]string{"--duration", "-1s"}, "--duration -1s: must not be negative"},
		{[]string{"--idle-gap", "-2ms"}, "--idle-gap -2ms: must not be negative"},
		{[]string{"--replay", "x", "--lib", "y"}, "--lib applies to live tracing"},
		{[]string{"--replay", "x", "--comm", ""}, "--comm: empty process name"},
		{[]string{"extra"}, "unknown command"},
	} {
		_, _, err := runCmd(t, append([]string{"trace"}, tt.args...)...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("trace %v: err %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestRecordPathErrors: a --record path that cannot be written says how
// to fix it before anything is attached.
func TestRecordPathErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ path, want string }{
		{dir, "--record " + dir + ": a directory: give the path of a file to write (e.g. " + filepath.Join(dir, "trace.arbt") + ")"},
		{filepath.Join(dir, "missing", "x.arbt"), "create the directory " + filepath.Join(dir, "missing") + " first"},
	} {
		r, err := newRecorder(c.path, io.Discard, nil)
		if err == nil {
			r.abort()
			t.Errorf("%s: no error", c.path)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.path, err, c.want)
		}
	}
}

func TestRequireTracingMessage(t *testing.T) {
	bit := func(cs ...caps.Cap) (s caps.Set) {
		for _, c := range cs {
			s |= 1 << c
		}
		return s
	}
	tests := []struct {
		name string
		have caps.Set
		want string // "" = allowed
	}{
		{"root", ^caps.Set(0), ""},
		{"bpf and perfmon", bit(caps.BPF, caps.Perfmon), ""},
		{"sys_admin alone", bit(caps.SysAdmin), ""},
		{"none", 0, "tracing CUDA calls needs CAP_BPF and CAP_PERFMON, which this process lacks: run it as root (sudo), or grant the capabilities (setcap cap_bpf,cap_perfmon+ep "},
		{"bpf only", bit(caps.BPF), "tracing CUDA calls needs CAP_PERFMON, which this process lacks: run it as root (sudo), or grant the capabilities (setcap cap_perfmon+ep "},
		{"perfmon only", bit(caps.Perfmon, caps.SysPtrace), "tracing CUDA calls needs CAP_BPF, which this process lacks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := requireTracing(tt.have)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("error %q, want prefix %q", err, tt.want)
			}
			if !strings.HasSuffix(err.Error(), "or use --replay FILE, which needs none") {
				t.Errorf("error %q does not offer --replay", err)
			}
			var ec exitCoder
			if !errors.As(err, &ec) || ec.ExitCode() != 77 {
				t.Errorf("exit code: %v", err)
			}
		})
	}
}

func TestTraceWithoutPrivilegeExits77(t *testing.T) {
	// The command checks capabilities before loading anything: with a
	// faked empty set it fails at once, naming both.
	o := &traceOptions{format: "text", idleGap: trace.DefaultIdleGap, haveCaps: func() (caps.Set, error) { return 0, nil }}
	err := runTrace(context.Background(), o, nil, &bytes.Buffer{}, &bytes.Buffer{}, nil)
	var ec exitCoder
	if !errors.As(err, &ec) || ec.ExitCode() != 77 || !strings.Contains(err.Error(), "CAP_BPF and CAP_PERFMON") {
		t.Fatalf("err = %v, want exit 77 naming CAP_BPF and CAP_PERFMON", err)
	}
	// As a real unprivileged process, through main: drop to nobody when
	// root (setpriv), or run as is when already unprivileged.
	args := []string{"trace", "--duration", "1s"}
	name := os.Args[0]
	if os.Geteuid() == 0 {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("setpriv not installed; the message is tested above")
		}
		bin := filepath.Join(t.TempDir(), "arbiter.test")
		data, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", bin}, args...)
		name = setpriv
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 77 {
		t.Fatalf("unprivileged trace: %v, want exit status 77\n%s", err, out)
	}
	if !strings.Contains(string(out), "arbiter: tracing CUDA calls needs CAP_BPF and CAP_PERFMON") {
		t.Errorf("output:\n%s", out)
	}
}

// TestUnmatchedProcesses: the processes a filter matched none of are
// listed up to missedMax, with "..." only when there were more.
func TestUnmatchedProcesses(t *testing.T) {
	for _, c := range []struct {
		n    int
		more bool
	}{{missedMax, false}, {missedMax + 1, true}} {
		f, err := newEventFilter(&traceOptions{pids: pidList{4242}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.n {
			ev := trace.Event{Kind: trace.KindLaunch, PID: uint32(100 + i)}
			f.match(&ev)
			f.match(&ev) // seen twice, listed once
		}
		got := strings.TrimSuffix(f.unmatched(), ", ...")
		if listed := strings.Count(got, ",") + 1; listed != missedMax || strings.HasSuffix(f.unmatched(), ", ...") != c.more {
			t.Errorf("%d processes: %d listed in %q", c.n, listed, f.unmatched())
		}
	}
}
