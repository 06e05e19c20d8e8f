package nvrm

import (
	"testing"
	"time"

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
		for b.Loop() {
			if err := c.SetTimeslice(s.pid, 1, 100); err != nil {
				b.Fatal(err)
			}
			if b.N%1024 == 0 {
				_, _ = tr.Drain(func(*trace.Event) {})
			}
		}
		perCall(b)
		tr.SetDeadline(time.Now())
	})
}
