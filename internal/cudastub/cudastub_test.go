package cudastub

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// setupSymbols are the non-probed calls the contract promises.
var setupSymbols = []string{"cuInit", "cuDeviceGet", "cuDeviceGetCount", "cuCtxCreate_v2",
	"cuCtxDestroy_v2", "cuStreamCreate", "cuStreamDestroy_v2", "cuEventCreate", "cuEventDestroy_v2",
	"cuModuleLoadData", "cuModuleGetFunction", "cuMemAlloc_v2", "cuMemFree_v2", "cuGetErrorName"}

// dynsym returns the library's exported function symbols.
func dynsym(t *testing.T, lib string) (*elf.File, []elf.Symbol) {
	t.Helper()
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var out []elf.Symbol
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			out = append(out, s)
		}
	}
	return f, out
}

func TestLibrarySONAME(t *testing.T) {
	b := ForTest(t)
	f, err := elf.Open(b.Lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sonames, err := f.DynString(elf.DT_SONAME)
	if err != nil {
		t.Fatal(err)
	}
	if len(sonames) != 1 || sonames[0] != "libcuda.so.1" {
		t.Errorf("SONAME = %q, want [libcuda.so.1]", sonames)
	}
}

func TestLibraryExportsEveryProbedFunction(t *testing.T) {
	b := ForTest(t)
	_, syms := dynsym(t, b.Lib)
	exported := map[string]int{}
	for _, s := range syms {
		exported[s.Name]++
		if !strings.HasPrefix(s.Name, "cu") {
			t.Errorf("unexpected export %q (internal symbols must stay local)", s.Name)
		}
	}
	var want []string
	for _, fn := range trace.Funcs() {
		want = append(want, fn.String())
	}
	want = append(want, setupSymbols...)
	for _, name := range want {
		n := exported[name]
		switch {
		case name == "cuStreamSynchronize" && n != 2:
			t.Errorf("%s exported %d times, want 2 (default and old version)", name, n)
		case name != "cuStreamSynchronize" && n != 1:
			t.Errorf("%s exported %d times, want 1", name, n)
		}
	}
}

func TestStreamSynchronizeVersions(t *testing.T) {
	b := ForTest(t)
	_, syms := dynsym(t, b.Lib)
	type ver struct {
		version string
		hidden  bool
	}
	var got []ver
	addrs := map[uint64]bool{}
	for _, s := range syms {
		if s.Name != "cuStreamSynchronize" {
			continue
		}
		if !s.HasVersion {
			t.Fatalf("cuStreamSynchronize has no version information")
		}
		got = append(got, ver{s.Version, s.VersionIndex.IsHidden()})
		addrs[s.Value] = true
	}
	want := map[ver]bool{{"LIBCUDA_2.0", false}: true, {"LIBCUDA_1.0", true}: true}
	if len(got) != 2 || !want[got[0]] || !want[got[1]] || got[0] == got[1] {
		t.Errorf("cuStreamSynchronize versions = %+v, want default LIBCUDA_2.0 and hidden LIBCUDA_1.0", got)
	}
	if len(addrs) != 2 {
		t.Errorf("the two versions share an address; they must be distinct functions")
	}
	// Every other symbol is in LIBCUDA_1.0 as its default.
	for _, s := range syms {
		if s.Name != "cuStreamSynchronize" && (s.Version != "LIBCUDA_1.0" || s.VersionIndex.IsHidden()) {
			t.Errorf("%s: version %s hidden=%v, want default LIBCUDA_1.0", s.Name, s.Version, s.VersionIndex.IsHidden())
		}
	}
}

// TestProbedPrologue checks that every exported probed function, both
// versions of cuStreamSynchronize included, begins with endbr64 (f3 0f 1e
// fa) followed by push %rbp (55).
func TestProbedPrologue(t *testing.T) {
	b := ForTest(t)
	f, syms := dynsym(t, b.Lib)
	text := f.Section(".text")
	if text == nil {
		t.Fatal("no .text section")
	}
	code, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	probed := map[string]bool{}
	for _, fn := range trace.Funcs() {
		probed[fn.String()] = true
	}
	want := []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55}
	checked := 0
	for _, s := range syms {
		if !probed[s.Name] {
			continue
		}
		off := s.Value - text.Addr
		if s.Value < text.Addr || off+uint64(len(want)) > uint64(len(code)) {
			t.Errorf("%s@%s: address %#x outside .text", s.Name, s.Version, s.Value)
			continue
		}
		if got := code[off : off+uint64(len(want))]; !bytes.Equal(got, want) {
			t.Errorf("%s@%s starts with % x, want % x (endbr64; push %%rbp)", s.Name, s.Version, got, want)
		}
		checked++
	}
	if checked != len(trace.Funcs())+1 {
		t.Errorf("checked %d probed functions, want %d", checked, len(trace.Funcs())+1)
	}
}

func TestCallsReturnCodesAndTiming(t *testing.T) {
	b := ForTest(t)
	prog := filepath.Join(t.TempDir(), "calls")
	if err := CompileProgram(b, filepath.Join("testdata", "calls.c"), prog, "-ldl"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(prog).CombinedOutput()
	if err != nil {
		t.Fatalf("calls: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		got[name] = val
	}
	want := map[string]string{
		"cuDeviceGet-before-init": "3", "cuInit": "0", "cuDeviceGet": "0", "cuCtxCreate_v2": "0",
		"cuModuleLoadData": "0", "cuModuleGetFunction": "0", "cuStreamCreate": "0", "cuEventCreate": "0",
		"cuMemAlloc_v2": "0", "cuGraphCreate": "0", "cuGraphInstantiateWithFlags": "0",
		"cuLaunchKernel-bogus-function": "400", "cuLaunchKernel-bogus-stream": "400",
		"cuLaunchKernel-default-stream": "0", "cuLaunchKernel_ptsz-per-thread": "0",
		"cuLaunchKernelEx-null-config": "1", "cuLaunchKernelEx": "0", "cuLaunchKernelEx_ptsz": "0",
		"cuLaunchCooperativeKernel": "0", "cuLaunchCooperativeKernel_ptsz": "0",
		"cuGraphLaunch": "0", "cuGraphLaunch_ptsz-bogus": "400",
		"cuMemcpyHtoD-null-host": "1", "cuMemcpyHtoD": "0", "cuMemcpyHtoD_v2": "0", "cuMemcpyHtoD_v2_ptds": "0",
		"cuMemcpyHtoDAsync": "0", "cuMemcpyHtoDAsync_v2-bogus-stream": "400", "cuMemcpyHtoDAsync_v2_ptsz": "0",
		"cuMemcpyDtoH-null-device": "1", "cuMemcpyDtoH_v2": "0", "cuMemcpyDtoH_v2_ptds": "0",
		"cuMemcpyDtoHAsync": "0", "cuMemcpyDtoHAsync_v2": "0", "cuMemcpyDtoHAsync_v2_ptsz": "0",
		"cuStreamSynchronize-bogus": "400", "cuStreamSynchronize_ptsz": "0", "cuEventSynchronize-bogus": "400",
		"cuStreamWaitEvent": "0", "cuStreamWaitEvent_ptsz-bogus-event": "400",
		"cuEventRecordWithFlags": "0", "cuEventRecordWithFlags_ptsz": "0", "cuEventRecord_ptsz-bogus-stream": "400",
		"cuCtxSynchronize": "0", "cuEventRecord": "0", "cuEventSynchronize": "0",
		"cuCtxSynchronize_v2": "0", "cuCtxSynchronize_v2-current": "0", "cuCtxSynchronize_v2-bogus": "201",
		"cuCtxSynchronize_v2-after-launch": "0", "cuCtxSynchronize_v2-current-after-launch": "0",
		"cuMemcpyHtoD_v2-12MB": "0", "cuGetErrorName": "0", "name": "CUDA_ERROR_INVALID_HANDLE",
		"cuGetErrorName-unknown": "1", "cuStreamDestroy_v2": "0", "cuStreamDestroy_v2-again": "400",
		"cuEventDestroy_v2": "0", "cuGraphExecDestroy": "0", "cuGraphDestroy": "0", "cuMemFree_v2": "0",
		"cuCtxDestroy_v2":   "0",
		"versions-distinct": "1", "default-is-2.0": "1", "cuStreamSynchronize@LIBCUDA_1.0": "0",
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s = %q, want %q", name, got[name], w)
		}
	}
	us := func(name string) int {
		v, err := strconv.Atoi(got[name])
		if err != nil {
			t.Fatalf("%s: %q", name, got[name])
		}
		return v
	}
	// Three 2 ms launches return at once (asynchronous) and the event
	// synchronize waits for all three.
	// Upper bounds are loose: other work on a loaded machine only adds
	// time; lower bounds are what the emulation promises.
	if l := us("launch-us"); l > 3000 {
		t.Errorf("3 launches took %d us; launches must not block (blocking would take 6000)", l)
	}
	if s := us("sync-us"); s < 6000 || s > 50000 {
		t.Errorf("event sync after 3×2 ms launches returned after %d us, want 6000..50000", s)
	}
	for _, name := range []string{"ctx-sync-us", "current-sync-us"} {
		if s := us(name); s < 2000 || s > 50000 {
			t.Errorf("cuCtxSynchronize_v2 after a 2 ms launch returned after %d us (%s), want 2000..50000", s, name)
		}
	}
	if c := us("copy-us"); c < 1000 || c > 30000 {
		t.Errorf("12 MB synchronous copy took %d us, want 1000..30000 (1000 at 12 GB/s)", c)
	}
}

var inferStats = regexp.MustCompile(`^infer: (\d+) requests in [0-9.]+ s: p50 (\d+) us, p99 (\d+) us, max (\d+) us\n$`)

func TestInferLatencies(t *testing.T) {
	b := ForTest(t)
	const launches, kernelUS = 8, 100
	cmd := exec.Command(b.Infer, "--requests", "50", "--rate", "500",
		"--launches", strconv.Itoa(launches), "--kernel-us", strconv.Itoa(kernelUS), "--bytes", "1048576")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("infer: %v\n%s", err, stderr.String())
	}
	m := inferStats.FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("infer output %q does not match %v", stderr.String(), inferStats)
	}
	n, _ := strconv.Atoi(m[1])
	p50, _ := strconv.Atoi(m[2])
	p99, _ := strconv.Atoi(m[3])
	maxUS, _ := strconv.Atoi(m[4])
	if n != 50 {
		t.Errorf("%d requests, want 50", n)
	}
	// Each request is 8×100 µs of kernels plus two 1 MiB copies (~87 µs
	// each at 12 GB/s), so no request can be shorter than ~970 µs.
	floor := launches*kernelUS + 2*(1048576/12)/1000
	if p50 < floor || p50 > p99 || p99 > maxUS {
		t.Errorf("p50 %d, p99 %d, max %d µs: want %d <= p50 <= p99 <= max", p50, p99, maxUS, floor)
	}
	if p50 > 10*floor {
		t.Errorf("p50 %d µs is implausibly far above the emulated %d µs", p50, floor)
	}
}

func TestInferRejectsBadFlag(t *testing.T) {
	b := ForTest(t)
	out, err := exec.Command(b.Infer, "--rate", "fast").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("infer --rate fast: err %v, want exit status 2", err)
	}
	if want := "infer: --rate: want a non-negative number, got \"fast\"\n"; string(out) != want {
		t.Errorf("output %q, want %q", out, want)
	}
}

var trainStats = regexp.MustCompile(`^train: (\d+) launches in ([0-9.]+) s: ([0-9.]+) launches/s\n$`)

func TestTrainExitsOnSignal(t *testing.T) {
	b := ForTest(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(b.Train, "--kernel-us", "1000", "--sync-every", "4")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			start := time.Now()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("train exited with %v after %v\n%s", err, sig, stderr.String())
				}
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("train did not exit within 5 s of %v", sig)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("train took %v to exit", d)
			}
			m := trainStats.FindStringSubmatch(stderr.String())
			if m == nil {
				t.Fatalf("train output %q does not match %v", stderr.String(), trainStats)
			}
			// 1 ms kernels: at most ~1000 launches/s (a loaded machine
			// only makes it slower), and it ran ~0.3 s.
			n, _ := strconv.Atoi(m[1])
			rate, _ := strconv.ParseFloat(m[3], 64)
			if n < 10 || rate > 1100 {
				t.Errorf("%d launches at %.1f/s; want >= 10 at <= 1100/s", n, rate)
			}
		})
	}
}

func TestTrainIterations(t *testing.T) {
	b := ForTest(t)
	cmd := exec.Command(b.Train, "--kernel-us", "0", "--iterations", "1000", "--sync-every", "10")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("train: %v\n%s", err, stderr.String())
	}
	out := stderr.String()
	m := trainStats.FindStringSubmatch(out)
	if m == nil || m[1] != "1000" {
		t.Fatalf("train output %q, want 1000 launches", out)
	}
}

func TestBuildAtReportsCompilerOutput(t *testing.T) {
	b := ForTest(t)
	bad := filepath.Join(t.TempDir(), "bad.c")
	if err := os.WriteFile(bad, []byte("int main(void) { return undefined_name; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := CompileProgram(b, bad, filepath.Join(t.TempDir(), "bad"))
	if err == nil || !strings.Contains(err.Error(), "undefined_name") || !strings.Contains(err.Error(), "bad.c") {
		t.Errorf("error %v, want gcc's message naming bad.c and undefined_name", err)
	}
}

func TestBuildAtIsRelocatable(t *testing.T) {
	// The workloads find the library through $ORIGIN, so a build still
	// runs after its directory moves (the demo copies bin/stub around).
	b := ForTest(t)
	dst := filepath.Join(t.TempDir(), "moved")
	if out, err := exec.Command("cp", "-a", b.Dir, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	out, err := exec.Command(filepath.Join(dst, "train"), "--iterations", "10", "--kernel-us", "0").CombinedOutput()
	if err != nil {
		t.Fatalf("moved train: %v\n%s", err, out)
	}
}

func TestCachedBuild(t *testing.T) {
	parent := t.TempDir()
	b1, err := cachedBuild(parent)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(b1.Lib)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := cachedBuild(parent)
	if err != nil {
		t.Fatal(err)
	}
	fi2, err := os.Stat(b2.Lib)
	if err != nil {
		t.Fatal(err)
	}
	if b1.Dir != b2.Dir || !fi.ModTime().Equal(fi2.ModTime()) {
		t.Errorf("second call rebuilt: %s %v vs %s %v", b1.Dir, fi.ModTime(), b2.Dir, fi2.ModTime())
	}
	// A cache directory others can write to is not trusted.
	if err := os.Chmod(b1.Dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, ok := existing(b1.Dir); ok {
		t.Error("a world-writable cache directory was trusted")
	}
	// Nor an incomplete one.
	if err := os.Chmod(b1.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(b1.Train); err != nil {
		t.Fatal(err)
	}
	if _, ok := existing(b1.Dir); ok {
		t.Error("an incomplete build was trusted")
	}
	entries, _ := os.ReadDir(parent)
	if len(entries) != 1 {
		t.Errorf("%d entries left in the cache parent, want 1", len(entries))
	}
}
