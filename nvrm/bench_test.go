package nvrm

import (
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// BenchmarkControlRoundTrip measures one channel-group control on the
// stand-in: pidfd_open + pidfd_getfd + fstat, the ioctl, close (a whole
// SetTimeslice on a process with one group on that GPU); the ioctl alone
// on a held duplicate; and the whole call with the tracer attached, as a
// daemon runs it.
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
	b.Run("ioctl", func(b *testing.B) {
		p, _ := reg.Process(s.pid)
		f, err := c.open(s.pid, p.StartTime, s.ctlFD)
		if err != nil {
			b.Fatal(err)
		}
		defer f.close()
		g := Group{Client: rmstandin.Client, Handle: rmstandin.GroupGR1}
		for b.Loop() {
			if err := f.setTimeslice(g, 100); err != nil {
				b.Fatal(err)
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
