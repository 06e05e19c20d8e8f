package uprobe

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
)

// TestDiscoverVersions checks that Discover reports each file once with
// the version its name, or a link on the way to it, carries: a relative
// link in a library directory, and an absolute link inside a container's
// root, which must resolve in that root and not on the host.
func TestDiscoverVersions(t *testing.T) {
	b := cudastub.ForTest(t)
	dir := t.TempDir()
	search := filepath.Join(dir, "search")
	proc := filepath.Join(dir, "proc")
	croot := filepath.Join(proc, "200", "root")
	for _, d := range []string{search, filepath.Join(croot, "usr/lib")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyLib(t, b.Lib, filepath.Join(search, "libcuda.so.550.54.15"))
	copyLib(t, b.Lib, filepath.Join(search, "libcuda.so.1.bak")) // no version: not a dotted number pair
	copyLib(t, b.Lib, filepath.Join(croot, "usr/lib/libcuda.so.535.104.05"))
	for _, l := range [][2]string{
		{"libcuda.so.550.54.15", filepath.Join(search, "libcuda.so.1")},
		{"/usr/lib/libcuda.so.535.104.05", filepath.Join(croot, "usr/lib/libcuda.so.1")},
	} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	inContainer := filepath.Join(croot, "usr/lib/libcuda.so.1")
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(croot, "usr/lib/libcuda.so.535.104.05"), &st); err != nil {
		t.Fatal(err)
	}
	dev := uint64(st.Dev)
	maj, min := dev>>8&0xfff|dev>>32&^0xfff, dev&0xff|dev>>12&^0xff
	line := "7f00-7f10 r-xp 00000000 " + strconv.FormatUint(maj, 16) + ":" + strconv.FormatUint(min, 16) + " " + strconv.FormatUint(st.Ino, 10) + " /usr/lib/libcuda.so.535.104.05\n"
	if err := os.WriteFile(filepath.Join(proc, "200", "maps"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}

	got, err := Discover(&Options{ProcRoot: proc, LdCache: "-", SearchDirs: []string{search}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		filepath.Join(search, "libcuda.so.1"):                 "550.54.15",
		filepath.Join(search, "libcuda.so.1.bak"):             "",
		filepath.Join(croot, "usr/lib/libcuda.so.535.104.05"): "535.104.05",
	}
	if len(got) != len(want) {
		t.Fatalf("found %+v, want %d files", got, len(want))
	}
	for _, f := range got {
		v, ok := want[f.Path]
		if !ok || f.Version != v {
			t.Errorf("%s: version %q (listed %v), want %q", f.Path, f.Version, ok, v)
		}
		if f.Inode == 0 || f.Source == "" {
			t.Errorf("%s: inode %d source %q", f.Path, f.Inode, f.Source)
		}
	}
	if v := libraryVersion(proc, inContainer); v != "535.104.05" {
		t.Errorf("absolute link in a container: version %q, want 535.104.05", v)
	}
	if _, err := Discover(&Options{Libraries: []string{filepath.Join(dir, "absent.so")}, LdCache: "-", SearchDirs: []string{}}); err == nil {
		t.Error("an absent Options.Libraries path gave no error")
	}
}

// TestDiscoverRunningProcess runs a program linked against the stub driver
// and checks that Discover finds the library through the process's own
// mappings alone.
func TestDiscoverRunningProcess(t *testing.T) {
	b := cudastub.ForTest(t)
	cmd := exec.Command(b.Train, "--duration", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	source := "maps of pid " + strconv.Itoa(cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := Discover(&Options{LdCache: "-", SearchDirs: []string{}})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range got {
			if f.Source == source && f.Path == b.Lib {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not found through pid %d's mappings: %+v", b.Lib, cmd.Process.Pid, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
