package nvrm

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// BenchmarkControlRoundTrip measures channel control on the stand-in: a
// whole SetTimeslice on a process with one group on that GPU (pidfd_getfd,
// fstat, the ioctl on the operation's worker, close); a Suspend of two
// groups (four controls on one duplicate); the bare ioctl on a held
// duplicate; and the SetTimeslice with the tracer attached, as a daemon
// runs it.
func BenchmarkControlRoundTrip(b *testing.B) {
	testenv.Privileged(b)
	bin, ctl := buildStandin(b)
	s := startStandin(b, bin, ctl)
	reg := newTestRegistry(b, "", nil)
	reg.opts.StartTime = procStartTime
	applyAll(reg, []trace.Event{
		evAlloc(s.pid, s.ctlFD, rmstandin.Client, 0, rmstandin.Client, ClassRootClient, 0, 0),
		evAlloc(s.pid, s.ctlFD, rmstandin.Client, rmstandin.Client, rmstandin.Device1, ClassDevice, 0, 1),
		evAlloc(s.pid, s.ctlFD, rmstandin.Client, rmstandin.Device1, rmstandin.GroupGR1, ClassChannelGroup, EngineGraphics, 0),
		evAlloc(s.pid, s.ctlFD, rmstandin.Client, rmstandin.Client, rmstandin.Device0, ClassDevice, 0, 0),
		evAlloc(s.pid, s.ctlFD, rmstandin.Client, rmstandin.Device0, rmstandin.GroupGR, ClassChannelGroup, EngineGraphics, 0),
		evAlloc(s.pid, s.ctlFD, rmstandin.Client, rmstandin.Device0, rmstandin.GroupCE, ClassChannelGroup, EngineCopy0, 0),
	})
	c, err := NewController(reg, &ControllerOptions{Layout: mustLayout(b, "575.51.03"), ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY})
	if err != nil {
		b.Fatal(err)
	}
	perCall := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/call")
	}
	b.Run("getfd+ioctl+close", func(b *testing.B) {
		for b.Loop() {
			if err := c.SetTimeslice(s.pid, 1, 100); err != nil {
				b.Fatal(err)
			}
		}
		perCall(b)
	})
	// A process with a compute and a copy group on GPU 0: Suspend is
	// SCHEDULE{0} + PREEMPT on each (4 controls, one duplicate).
	b.Run("suspend-2-groups", func(b *testing.B) {
		for b.Loop() {
			if err := c.Suspend(s.pid, 0); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := c.Resume(s.pid, 0); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		perCall(b)
	})
	// The floor: the same ioctl issued directly on a held duplicate, with
	// no pidfd, duplication, checks or worker.
	// The same with the suspension recorded in a state file on tmpfs
	// before the controls, as a keeper does.
	b.Run("suspend-2-groups-state", func(b *testing.B) {
		dir, err := os.MkdirTemp("/dev/shm", "arbiter-bench-")
		if err != nil {
			b.Skip("no /dev/shm")
		}
		defer os.RemoveAll(dir)
		reg.opts.StatePath = dir + "/state.json"
		defer func() { reg.opts.StatePath = "" }()
		for b.Loop() {
			if err := c.Suspend(s.pid, 0); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := c.Resume(s.pid, 0); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		perCall(b)
	})
	b.Run("ioctl-only", func(b *testing.B) {
		p, _ := reg.Process(s.pid)
		f, err := c.open(s.pid, p.StartTime, s.ctlFD)
		if err != nil {
			b.Fatal(err)
		}
		defer f.close()
		req := &NVOS54{HClient: rmstandin.Client, HObject: rmstandin.GroupGR1, Cmd: uint32(CtrlSetTimeslice), ParamsSize: 8}
		params := TimesliceParams{TimesliceUs: 100}
		req.Params = uint64(uintptr(unsafe.Pointer(&params)))
		for b.Loop() {
			if e := sysIoctl(f.fd, ReqRMControl, unsafe.Pointer(req)); e != 0 && e != unix.ENOTTY {
				b.Fatal(e)
			}
		}
		perCall(b)
	})
	b.Run("traced", func(b *testing.B) {
		tr, err := NewTracer(&TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY})
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Close()
		n := 0
		for b.Loop() {
			if err := c.SetTimeslice(s.pid, 1, 100); err != nil {
				b.Fatal(err)
			}
			// Read as a daemon would, so the ring buffer never fills.
			if n++; n%256 == 0 {
				if _, err := tr.Drain(func(*trace.Event) {}); err != nil {
					b.Fatal(err)
				}
			}
		}
		perCall(b)
		if st, err := tr.Stats(); err != nil || st.RingbufFull != 0 {
			b.Fatalf("tracer dropped records: %+v, %v", st, err)
		}
	})
}

// BenchmarkTracerOverhead measures what the tracer costs every ioctl on
// the machine: an ioctl that is not an RM call (rejected on its type
// byte), an RM request on another device (rejected on the device number),
// and an RM call on the control device (recorded), each against the same
// ioctl with no tracer attached.
func BenchmarkTracerOverhead(b *testing.B) {
	testenv.Privileged(b)
	_, ctl := buildStandin(b)
	ctlFD, err := unix.Open(ctl, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(ctlFD)
	nullFD, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(nullFD)
	var blk NVOS54
	call := func(fd int, req uint32) {
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&blk)))
	}
	cases := []struct {
		name string
		fd   int
		req  uint32
	}{
		{"other-ioctl", nullFD, unix.TCGETS},
		{"rm-other-device", nullFD, ReqRMControl},
		{"rm-recorded", ctlFD, ReqRMControl},
	}
	// measure returns the best of 5 rounds of n calls, in ns per call:
	// the machine is shared, and the minimum is the least disturbed.
	measure := func(fd int, req uint32, n int, tr *Tracer) float64 {
		best := 0.0
		for range 5 {
			start := time.Now()
			for range n {
				call(fd, req)
			}
			ns := float64(time.Since(start).Nanoseconds()) / float64(n)
			if best == 0 || ns < best {
				best = ns
			}
			if tr != nil {
				if _, err := tr.Drain(func(*trace.Event) {}); err != nil {
					b.Fatal(err)
				}
			}
		}
		return best
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			blk = NVOS54{Cmd: uint32(CtrlSetTimeslice)}
			const n = 2000 // under the ring buffer's capacity per round
			bare := measure(tc.fd, tc.req, n, nil)
			tr, err := NewTracer(&TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			traced := measure(tc.fd, tc.req, n, tr)
			i := 0
			for b.Loop() {
				call(tc.fd, tc.req)
				if i++; i%1024 == 0 {
					if _, err := tr.Drain(func(*trace.Event) {}); err != nil {
						b.Fatal(err)
					}
				}
			}
			if st, err := tr.Stats(); err != nil || st.RingbufFull != 0 {
				b.Fatalf("tracer dropped records: %+v, %v", st, err)
			}
			b.ReportMetric(bare, "bare-ns/ioctl")
			b.ReportMetric(traced, "traced-ns/ioctl")
			b.ReportMetric(traced-bare, "added-ns/ioctl")
			b.ReportMetric(traced/bare, "ratio")
		})
	}
}
