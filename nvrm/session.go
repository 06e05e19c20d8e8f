package nvrm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// session is one Controller operation's access to a process's control
// files: the duplicates it opened, by descriptor. It belongs to the
// operation's worker goroutine, and closes the duplicates when the worker
// ends: a held duplicate would keep a dead process's GPU memory and
// channels alive.
type session struct {
	c     *Controller
	pid   uint32
	start uint64
	watch *callWatch
	files map[int32]*rmFile
	// failed holds why a descriptor could not be duplicated, so that it
	// is tried and reported once.
	failed map[int32]error
}

// run runs fn on one worker goroutine with a session of pid's (started at
// start) control files, so that the caller gets control back if the
// driver does not answer: each ioctl may take up to Timeout, after which
// run returns ErrCallTimeout and the worker issues no further call, and
// closes the duplicates once the stuck call returns. It reports whether
// fn finished: after a timeout, whatever fn writes must not be read. One
// worker per operation rather than per ioctl: a thread hand-off costs a
// futex wake-up, microseconds on a virtualized host, and a suspend is
// several controls in a row.
func (c *Controller) run(pid uint32, start uint64, fn func(*session) error) (bool, error) {
	s := &session{c: c, pid: pid, start: start, watch: &callWatch{base: time.Now()},
		files: map[int32]*rmFile{}, failed: map[int32]error{}}
	done := make(chan error, 1)
	go func() {
		defer s.close()
		done <- fn(s)
	}()
	t := time.NewTimer(c.opts.Timeout)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return true, err
		case <-t.C:
			inFlight := s.watch.inFlight()
			if inFlight >= c.opts.Timeout {
				s.watch.abandoned.Store(true)
				return false, fmt.Errorf("nvrm: process %d: driver call still running after %v: %w", pid, c.opts.Timeout, ErrCallTimeout)
			}
			t.Reset(c.opts.Timeout - inFlight)
		}
	}
}

// onGroups runs fn on each of pid's groups through its control files (one
// duplicate per client descriptor), as eachGroup, and returns the errors
// joined.
func (c *Controller) onGroups(pid uint32, groups []Group, fn func(*rmFile, Group) error) error {
	start, err := c.reg.startTime(pid)
	if err != nil {
		return err
	}
	_, err = c.run(pid, start, func(s *session) error {
		_, err := s.eachGroup(groups, fn)
		return err
	})
	return c.explainInvalidClient(pid, err)
}

// eachGroup runs fn on each group in turn. A group that fails does not
// stop the others: its error is joined to the rest, and done says which
// groups fn completed. A process that exited, or a call past its timeout,
// stops the run: nothing further can be issued.
func (s *session) eachGroup(groups []Group, fn func(*rmFile, Group) error) (done []bool, err error) {
	done = make([]bool, len(groups))
	var errs []error
	for i, g := range groups {
		_, reported := s.failed[g.FD]
		f, err := s.file(g.FD)
		switch {
		case err != nil && reported:
			continue // the descriptor's error is in errs once
		case err == nil:
			if err = fn(f, g); err != nil {
				err = fmt.Errorf("nvrm: process %d, channel group %#x: %w", s.pid, g.Handle, err)
			}
		}
		if err != nil {
			errs = append(errs, err)
			if stopsRun(err) {
				break
			}
			continue
		}
		done[i] = true
	}
	return done, errors.Join(errs...)
}

// stopsRun reports whether err ends a run: the process is gone, or the
// caller gave up waiting.
func stopsRun(err error) bool {
	return errors.Is(err, ErrProcessExited) || errors.Is(err, ErrCallTimeout)
}

// file returns the duplicate of descriptor fd, opening it on first use.
// A descriptor that failed to open fails again, with an error wrapping
// the first.
func (s *session) file(fd int32) (*rmFile, error) {
	if f := s.files[fd]; f != nil {
		return f, nil
	}
	if err, ok := s.failed[fd]; ok {
		return nil, err
	}
	f, err := s.c.open(s.pid, s.start, fd)
	if err != nil {
		s.failed[fd] = err
		return nil, err
	}
	f.watch = s.watch
	s.files[fd] = f
	return f, nil
}

// close closes the session's duplicates.
func (s *session) close() {
	for fd, f := range s.files {
		f.close()
		delete(s.files, fd)
	}
}

// callWatch lets the waiting caller see how long the worker's current
// ioctl has run, without a hand-off per call.
type callWatch struct {
	base time.Time
	// started is when the ioctl in flight started (ns after base, +1),
	// 0 between calls.
	started atomic.Int64
	// abandoned is set when the caller gave up: the worker issues no
	// further calls.
	abandoned atomic.Bool
}

// inFlight returns how long the current ioctl has run, 0 if none runs.
func (w *callWatch) inFlight() time.Duration {
	s := w.started.Load()
	if s == 0 {
		return 0
	}
	return time.Since(w.base) - time.Duration(s-1)
}

// rmFile is a duplicate of a process's control file, owned by one
// Controller operation's worker.
type rmFile struct {
	fd     int
	accept syscall.Errno
	// sys issues the ioctl; tests replace it.
	sys func(fd int, req uint32, arg unsafe.Pointer) syscall.Errno
	// respond, where set, answers each control before it is issued
	// (ControllerOptions.Respond).
	respond func(client, object, cmd uint32, params []byte) uint32
	// watch, where set, tells the waiting caller about calls in flight.
	watch *callWatch
	// preemptUs is the timeout sent with PREEMPT.
	preemptUs uint32
}

// open duplicates descriptor fd of process pid (started at start), through
// a pidfd that pins the process: a pid reused after an exit is refused
// rather than controlled.
func (c *Controller) open(pid uint32, start uint64, fd int32) (*rmFile, error) {
	pidfd, err := c.pidfd(pid, start)
	if err != nil {
		return nil, err
	}
	dup, err := unix.PidfdGetfd(pidfd, int(fd), 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		c.dropPidfd(pid)
		return nil, fmt.Errorf("nvrm: process %d: %w", pid, ErrProcessExited)
	case errors.Is(err, unix.EBADF):
		return nil, fmt.Errorf("nvrm: process %d descriptor %d: %w (closed since traced)", pid, fd, ErrNotControlFile)
	case errors.Is(err, unix.EPERM):
		return nil, fmt.Errorf("nvrm: pidfd_getfd process %d descriptor %d: %w (needs root or CAP_SYS_PTRACE, and Yama ptrace_scope below 3)", pid, fd, err)
	case err != nil:
		return nil, fmt.Errorf("nvrm: pidfd_getfd process %d descriptor %d: %w", pid, fd, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(dup, &st); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("nvrm: fstat process %d descriptor %d: %w", pid, fd, err)
	}
	got := MkRdev(unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || got != c.opts.ControlRdev {
		unix.Close(dup)
		return nil, fmt.Errorf("nvrm: process %d descriptor %d is %s, want char %s: %w", pid, fd, got, c.opts.ControlRdev, ErrNotControlFile)
	}
	return &rmFile{fd: dup, accept: c.opts.AcceptErrno, sys: c.sys, respond: c.opts.Respond,
		preemptUs: uint32(c.opts.PreemptTimeout / time.Microsecond)}, nil
}

// pidfd returns the cached pidfd of pid, opening and checking it first.
func (c *Controller) pidfd(pid uint32, start uint64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pidfds[pid]; ok && e.start == start {
		return e.fd, nil
	} else if ok {
		unix.Close(e.fd)
		delete(c.pidfds, pid)
	}
	fd, err := unix.PidfdOpen(int(pid), unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return -1, fmt.Errorf("nvrm: process %d: %w", pid, ErrProcessExited)
		}
		return -1, fmt.Errorf("nvrm: pidfd_open %d: %w", pid, err)
	}
	// The pidfd now names one process; check it is the one traced.
	if now := c.reg.opts.StartTime(pid); now == 0 || (start != 0 && now != start) {
		unix.Close(fd)
		return -1, fmt.Errorf("nvrm: process %d: %w (pid reused)", pid, ErrProcessExited)
	}
	c.pidfds[pid] = pidfdEntry{fd: fd, start: start}
	return fd, nil
}

// dropPidfd closes pid's cached pidfd.
func (c *Controller) dropPidfd(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pidfds[pid]; ok {
		unix.Close(e.fd)
		delete(c.pidfds, pid)
	}
}

// close closes the duplicate.
func (f *rmFile) close() { unix.Close(f.fd) }

// control issues RM_CONTROL cmd on group g with params of size bytes and
// returns the driver's status as an error.
func (f *rmFile) control(g Group, cmd Control, params unsafe.Pointer, size uint32) error {
	return f.call(g.Client, g.Handle, cmd, params, size)
}

// call issues RM_CONTROL cmd on object of client. It never issues
// GET_INTERLEAVE_LEVEL, which no driver exports.
func (f *rmFile) call(client, object uint32, cmd Control, params unsafe.Pointer, size uint32) error {
	if cmd == CtrlGetInterleaveLevel {
		return fmt.Errorf("%s: %w: no driver exports it; the registry records the level set", cmd, ErrNotSupported)
	}
	req := &NVOS54{HClient: client, HObject: object, Cmd: uint32(cmd), Params: uint64(uintptr(params)), ParamsSize: size}
	if f.respond != nil {
		req.Status = f.respond(client, object, uint32(cmd), unsafe.Slice((*byte)(params), size))
	}
	if err := f.ioctl(ReqRMControl, unsafe.Pointer(req), params); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if err := Status(req.Status).Err(); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return nil
}

func (f *rmFile) setTimeslice(g Group, us uint64) error {
	p := TimesliceParams{TimesliceUs: us}
	return f.control(g, CtrlSetTimeslice, unsafe.Pointer(&p), uint32(unsafe.Sizeof(p)))
}

// preempt takes g off the GPU, waiting for it (bWait) up to the
// controller's PREEMPT timeout, which it sends explicitly.
func (f *rmFile) preempt(g Group) error {
	p := PreemptParams{BWait: 1, BManualTimeout: 1, TimeoutUs: f.preemptUs}
	return f.control(g, CtrlPreempt, unsafe.Pointer(&p), uint32(unsafe.Sizeof(p)))
}

func (f *rmFile) schedule(g Group, enable bool, size uint32) error {
	p := ScheduleParams{}
	if enable {
		p.BEnable = 1
	}
	return f.control(g, CtrlGPFIFOSchedule, unsafe.Pointer(&p), size)
}

// disableChannels issues FIFO_DISABLE_CHANNELS on subdevice for channels,
// all of client: disable preempts them off the GPU and keeps them off
// (bOnlyDisableScheduling 0), !disable lets them run again. One call takes
// up to 64 channels.
func (f *rmFile) disableChannels(client, subdevice uint32, channels []uint32, disable bool) error {
	for batch := range slices.Chunk(channels, len(FIFODisableChannelsParams{}.HChannelList)) {
		p := FIFODisableChannelsParams{NumChannels: uint32(len(batch))}
		if disable {
			p.BDisable = 1
		}
		for i, ch := range batch {
			p.HClientList[i], p.HChannelList[i] = client, ch
		}
		if err := f.call(client, subdevice, CtrlFIFODisableChannels, unsafe.Pointer(&p), uint32(unsafe.Sizeof(p))); err != nil {
			return err
		}
	}
	return nil
}

// ioctl runs one ioctl on the duplicate. params is the memory the
// request points to, kept alive across the call.
func (f *rmFile) ioctl(req uint32, arg, params unsafe.Pointer) error {
	if f.watch != nil {
		if f.watch.abandoned.Load() {
			return ErrCallTimeout
		}
		f.watch.started.Store(int64(time.Since(f.watch.base)) + 1)
		defer f.watch.started.Store(0)
	}
	e := f.sys(f.fd, req, arg)
	runtime.KeepAlive(params)
	if e != 0 && (f.accept == 0 || e != f.accept) {
		return os.NewSyscallError("ioctl", e)
	}
	return nil
}

// sysIoctl is the ioctl system call.
func sysIoctl(fd int, req uint32, arg unsafe.Pointer) syscall.Errno {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	return e
}
