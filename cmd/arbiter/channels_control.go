package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// controlKeeper opens the keeper for a control command: the driver, the
// privileges (those every control needs, and extra), the registry
// (draining a pinned tracer) and the controller.
func (o *channelsOptions) controlKeeper(stderr io.Writer, what string, extra ...caps.Cap) (*nvrm.Keeper, error) {
	if err := o.checkDriver(); err != nil {
		return nil, err
	}
	want := append([]caps.Cap{caps.SysPtrace, caps.BPF, caps.Perfmon}, extra...)
	if err := o.requireCaps(what, want...); err != nil {
		var me *caps.MissingError
		if errors.As(err, &me) && slices.Contains(me.Caps, caps.SysNice) {
			me.Hint = "or grant CAP_SYS_ADMIN in place of CAP_SYS_NICE: the driver accepts either"
		}
		return nil, err
	}
	k, warn, err := o.keeper(keeperMode{trace: nvrm.TraceIfPinned, control: true})
	if err != nil {
		return nil, explain(0, err)
	}
	if warn != nil {
		fmt.Fprintf(stderr, "warning: %v\n", warn)
	}
	if k.ResumeErr != nil {
		fmt.Fprintf(stderr, "warning: resuming channel groups a previous run left suspended: %v\n", k.ResumeErr)
	}
	return k, nil
}

// newChannelsTimesliceCmd builds `arbiter channels timeslice PID µs`.
func newChannelsTimesliceCmd(o *channelsOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "timeslice PID MICROSECONDS",
		Short: "Set a process's channel-group timeslice and read it back",
		Long: `Timeslice sets the timeslice of the process's channel groups (on --gpu, or
all) with SET_TIMESLICE and reads it back with GET_TIMESLICE. The driver
rounds it to what the hardware supports and applies it at once; its default
is 1024 µs. CUDA sets its own from the node's compute policy when it creates
a context: a running daemon or "channels watch" re-applies Arbiter's value
after it, a one-shot command cannot.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[0])
			if err != nil {
				return err
			}
			us, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || us == 0 {
				return usageErrorf("MICROSECONDS %q: want a positive integer", args[1])
			}
			k, err := o.controlKeeper(cmd.ErrOrStderr(), "controlling another process's channels")
			if err != nil {
				return err
			}
			defer k.Close()
			c := k.Controller()
			start := time.Now()
			if err := c.SetTimeslice(pid, o.gpu, us); err != nil {
				return explain(pid, err)
			}
			took := time.Since(start)
			got, err := c.Timeslice(pid, o.gpu)
			if err != nil {
				return explain(pid, err)
			}
			groups, _ := k.Registry().Groups(pid, o.gpu)
			for _, g := range groups {
				fmt.Fprintf(cmd.OutOrStdout(), "process %d group %#x (%s, GPU %d): timeslice set to %d µs, driver reports %d µs\n",
					pid, g.Handle, g.Engine, g.Instance, us, got[g.Handle])
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d group(s) in %v\n", len(groups), took.Round(time.Microsecond))
			return nil
		},
	}
	cmd.Flags().IntVar(&o.gpu, "gpu", -1, "only the channel groups on this GPU (device instance); all when negative")
	return cmd
}

// newChannelsInterleaveCmd builds `arbiter channels interleave PID LEVEL`.
func newChannelsInterleaveCmd(o *channelsOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "interleave PID low|medium|high",
		Short: "Set a process's channel-group interleave level",
		Long: `Interleave sets the interleave level of all the process's channel groups
(SET_INTERLEAVE_LEVEL): their share of runlist slots, which matters under the
CHANNEL_INTERLEAVED runlist policy. The driver's default is medium. The
driver allows it only to a caller holding CAP_SYS_NICE or CAP_SYS_ADMIN.
The driver cannot read the level back: Arbiter's own record of it is
what "channels list" knows.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[0])
			if err != nil {
				return err
			}
			level, err := sched.ParseInterleave(args[1])
			if err != nil {
				return &usageError{err}
			}
			// The driver's RS_ACCESS_NICE: CAP_SYS_NICE, or CAP_SYS_ADMIN
			// (which caps counts as covering it).
			k, err := o.controlKeeper(cmd.ErrOrStderr(), "setting another process's interleave level", caps.SysNice)
			if err != nil {
				return err
			}
			defer k.Close()
			if err := k.Controller().SetInterleave(pid, level); err != nil {
				return explain(pid, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "process %d: interleave level %s\n", pid, level)
			return nil
		},
	}
}

// newChannelsSuspendCmd builds `arbiter channels suspend PID`.
func newChannelsSuspendCmd(o *channelsOptions) *cobra.Command {
	var hold time.Duration
	var methodName string
	cmd := &cobra.Command{
		Use:   "suspend PID",
		Short: "Take a process's channel groups off the GPU until interrupted",
		Long: `Suspend takes the process's channel groups off the GPU and keeps them off
until Ctrl-C, SIGTERM or --for elapses, then resumes them. --method chooses
how:

  disable-channels  FIFO_DISABLE_CHANNELS on the process's own subdevice,
                    listing its channels: one driver call per GPU, which
                    preempts them; GSP GPUs only (H100, H200, ...)
  schedule          GPFIFO_SCHEDULE{0} then PREEMPT (waiting) on each group;
                    for GPUs without GSP: on an H100 (GSP, driver 580) the
                    driver accepts both and the work keeps running
  auto              disable-channels where the GPU answers it and every
                    channel was traced, else schedule (the default)

Every group is tried even where one fails; the errors are reported
together. Arbiter never leaves a process suspended: the suspension is
recorded in the state directory before the first control, so if this
command is killed the next arbiter command or daemon start resumes the
process.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[0])
			if err != nil {
				return err
			}
			method, err := nvrm.ParseSuspendMethod(methodName)
			if err != nil {
				return usageErrorf("--method %q: want auto, schedule or disable-channels", methodName)
			}
			k, err := o.controlKeeper(cmd.ErrOrStderr(), "controlling another process's channels")
			if err != nil {
				return err
			}
			defer k.Close()
			c := k.Controller()
			out := cmd.OutOrStdout()
			start := time.Now()
			steps, err := c.SuspendWith(pid, o.gpu, &nvrm.SuspendOptions{Method: method})
			if err != nil {
				// Close resumes whatever took effect, from the records.
				return explain(pid, err)
			}
			fmt.Fprintf(out, "process %d suspended in %v (%s)\n", pid, time.Since(start).Round(time.Microsecond), suspendSteps(steps))
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if hold > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, hold)
				defer cancel()
			} else {
				fmt.Fprintln(out, "holding; Ctrl-C resumes")
			}
			<-ctx.Done()
			start = time.Now()
			if err := c.Resume(pid, o.gpu); err != nil {
				return explain(pid, err)
			}
			fmt.Fprintf(out, "process %d resumed in %v\n", pid, time.Since(start).Round(time.Microsecond))
			return nil
		},
	}
	cmd.Flags().IntVar(&o.gpu, "gpu", -1, "only the channel groups on this GPU (device instance); all when negative")
	cmd.Flags().DurationVar(&hold, "for", 0, "resume after this long (default: hold until interrupted)")
	cmd.Flags().StringVar(&methodName, "method", nvrm.SuspendAuto.String(), "how: auto, schedule or disable-channels")
	return cmd
}

// suspendSteps says how each GPU's groups were suspended, e.g. "GPU 0:
// disable-channels, 2 groups; GPU 1: schedule (FIFO_DISABLE_CHANNELS not
// supported), 1 group".
func suspendSteps(steps []nvrm.SuspendStep) string {
	parts := make([]string, len(steps))
	for i, s := range steps {
		how := s.Method.String()
		if s.FellBack {
			how += " (FIFO_DISABLE_CHANNELS not supported)"
		}
		noun := "groups"
		if s.Groups == 1 {
			noun = "group"
		}
		parts[i] = fmt.Sprintf("GPU %d: %s, %d %s", s.GPU, how, s.Groups, noun)
	}
	return strings.Join(parts, "; ")
}

// newChannelsResumeCmd builds `arbiter channels resume PID`.
func newChannelsResumeCmd(o *channelsOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "resume PID",
		Short: "Schedule a process's channel groups again",
		Long: `Resume re-enables scheduling of the process's channel groups
(GPFIFO_SCHEDULE{1}) and clears their suspension record. Any arbiter
channels command already resumes what a killed run left suspended when it
starts; resume is for doing so explicitly.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[0])
			if err != nil {
				return err
			}
			k, err := o.controlKeeper(cmd.ErrOrStderr(), "controlling another process's channels")
			if err != nil {
				return err
			}
			defer k.Close()
			if err := k.Controller().Resume(pid, o.gpu); err != nil {
				return explain(pid, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "process %d resumed\n", pid)
			return nil
		},
	}
	cmd.Flags().IntVar(&o.gpu, "gpu", -1, "only the channel groups on this GPU (device instance); all when negative")
	return cmd
}

// newChannelsWatchCmd builds `arbiter channels watch`.
func newChannelsWatchCmd(o *channelsOptions) *cobra.Command {
	var keepPinned bool
	var duration time.Duration
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Trace RM allocations, frees and channel-group controls live",
		Long: `Watch attaches the RM tracer and prints each allocation, free and
channel-group control processes issue on the driver's control device, and
each exit of a traced process, while keeping the handle registry. With
--pin (the default) the tracer stays attached after watch exits, so handles
of processes started later are still recorded for list, timeslice and
suspend; --pin=false removes it on exit. Once the tracer is attached it
says so on stderr ("watching: ..."): processes that create their CUDA
context after that line are recorded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.format != "text" && o.format != "json" {
				return usageErrorf("--format %q: want text or json", o.format)
			}
			if err := o.checkDriver(); err != nil {
				return err
			}
			if err := o.requireCaps("tracing RM calls", caps.BPF, caps.Perfmon, caps.SysPtrace); err != nil {
				return err
			}
			k, warn, err := o.keeper(keeperMode{trace: nvrm.TraceAlways, control: true, optional: true, unpin: !keepPinned})
			if err != nil {
				return explain(0, err)
			}
			if warn != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", warn)
			}
			if k.ResumeErr != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: resuming channel groups a previous run left suspended: %v\n", k.ResumeErr)
			}
			defer k.Close()
			// Said once the tracer is attached: what a process does on
			// the driver from now on is recorded (scripts wait for it).
			onExit := "detached on exit (--pin=false)"
			if keepPinned {
				onExit = "left attached on exit (--pin)"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "watching: the RM tracer is attached, %s; Ctrl-C stops\n", onExit)
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
			enc := json.NewEncoder(out)
			defer func() {
				if st, err := k.Tracer().Stats(); err == nil {
					fmt.Fprintf(errw, "tracer: %d records read, %d undecodable; dropped in the kernel: %d (ring buffer full), %d (parameters unreadable), %d (in-flight table full)\n",
						st.Decoded, st.BadRecords, st.RingbufFull, st.ReadFailed, st.InflightFull)
				}
			}()
			return k.Run(ctx, func(e nvrm.KeeperEvent) {
				switch {
				case e.Err != nil && o.format == "json":
					_ = enc.Encode(map[string]string{"warning": e.Err.Error()})
				case e.Err != nil:
					fmt.Fprintf(errw, "warning: %v\n", e.Err)
				}
				if !e.Event.Kind.Valid() {
					return
				}
				if o.format == "json" {
					_ = enc.Encode(watchJSON(&e.Event))
					return
				}
				fmt.Fprintln(out, watchText(&e.Event))
			})
		},
	}
	cmd.Flags().BoolVar(&keepPinned, "pin", true, "leave the tracer attached (pinned) after exit")
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop after this long (default: until interrupted)")
	return cmd
}

// watchText formats one traced event as a line.
func watchText(ev *trace.Event) string {
	rm := &ev.RM
	head := fmt.Sprintf("%d.%06d pid %d %s", ev.Time/1e9, ev.Time%1e9/1e3, ev.PID, ev.Kind)
	switch ev.Kind {
	case trace.KindRMAlloc:
		s := fmt.Sprintf("%s fd %d client %#x parent %#x object %#x %s", head, rm.FD, rm.Client, rm.Parent, rm.Object, nvrm.Class(rm.Class))
		switch nvrm.Class(rm.Class) {
		case nvrm.ClassChannelGroup:
			s += " engine " + nvrm.EngineType(rm.EngineType).String()
		case nvrm.ClassDevice, nvrm.ClassSubdevice:
			s += fmt.Sprintf(" instance %d", rm.Value)
		}
		return s
	case trace.KindRMFree:
		return fmt.Sprintf("%s fd %d client %#x parent %#x object %#x", head, rm.FD, rm.Client, rm.Parent, rm.Object)
	case trace.KindRMControl:
		return fmt.Sprintf("%s fd %d client %#x object %#x %s %d", head, rm.FD, rm.Client, rm.Object, nvrm.Control(rm.Cmd), rm.Value)
	}
	return head
}

// watchJSON is one traced event as JSON.
func watchJSON(ev *trace.Event) map[string]any {
	m := map[string]any{"time_ns": ev.Time, "pid": ev.PID, "tid": ev.TID, "kind": ev.Kind.String()}
	if ev.Kind == trace.KindExit {
		return m
	}
	rm := &ev.RM
	m["fd"], m["client"], m["object"] = rm.FD, rm.Client, rm.Object
	switch ev.Kind {
	case trace.KindRMAlloc:
		m["parent"], m["class"], m["class_name"] = rm.Parent, rm.Class, nvrm.Class(rm.Class).String()
		if rm.Class == uint32(nvrm.ClassChannelGroup) {
			m["engine"] = nvrm.EngineType(rm.EngineType).String()
		}
		if rm.Class == uint32(nvrm.ClassDevice) || rm.Class == uint32(nvrm.ClassSubdevice) {
			m["instance"] = rm.Value
		}
	case trace.KindRMFree:
		m["parent"] = rm.Parent
	case trace.KindRMControl:
		m["cmd"], m["control"], m["value"] = rm.Cmd, nvrm.Control(rm.Cmd).String(), rm.Value
	}
	return m
}
