package input

import (
	"os"
	"testing"

	"github.com/gpu-arbiter/arbiter/procfs"
)

// BenchmarkReadProcess reads one live process's classification input, as
// the daemon does for every new CUDA process: stat, comm, exe, cmdline,
// status and the passwd lookup, cgroup, environ and the fd scan. The
// process is this test binary (tens of descriptors, a few KiB of
// environment).
func BenchmarkReadProcess(b *testing.B) {
	proc, pid := procfs.New("/"), os.Getpid()
	b.ReportAllocs()
	for b.Loop() {
		p, err := ReadProcess(proc, pid, nil)
		if err != nil || p.PID != pid || p.Comm == "" {
			b.Fatal(p, err)
		}
	}
}
