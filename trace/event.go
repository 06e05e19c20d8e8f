package trace

// Event is one observed driver call or process lifecycle change.
//
// Event is a flat value with no pointers so that a reader can decode a
// ring-buffer record into a reused Event without allocating. Only the
// sub-struct that matches Kind is meaningful; the others are zero.
type Event struct {
	// Kind says which of the sub-structs below holds the payload.
	Kind Kind
	// Func is the driver API entry point for launch, copy and sync events
	// (FuncNone for the others).
	Func Func
	// PID is the process (thread-group) id, TID the calling thread.
	PID uint32
	TID uint32
	// Time is when the call entered, in nanoseconds of CLOCK_MONOTONIC
	// (bpf_ktime_get_ns), comparable across all events of one boot.
	Time uint64
	// Cgroup is the cgroup v2 id of the calling task.
	Cgroup uint64

	Launch Launch
	Copy   Copy
	Sync   Sync
	Proc   Proc
	RM     RM
}

// Launch holds the arguments of a kernel or graph launch.
type Launch struct {
	// Function is the CUfunction handle, or the CUgraphExec for cuGraphLaunch.
	Function uint64
	// Stream is the CUstream handle (0 is the legacy default stream).
	Stream uint64
	// Grid and Block are the launch dimensions (zero for graph launches).
	Grid  [3]uint32
	Block [3]uint32
	// SharedMem is the dynamic shared memory size in bytes.
	SharedMem uint32
}

// Copy holds the arguments of a host/device memory copy.
type Copy struct {
	Dir CopyDir
	// Bytes is the copy size.
	Bytes uint64
	// Device is the CUdeviceptr side of the copy, Host the host pointer.
	Device uint64
	Host   uint64
	// Stream is the CUstream of an asynchronous copy, 0 for synchronous ones.
	Stream uint64
}

// Sync holds a synchronizing call's handles and outcome, measured from its
// entry to its return.
type Sync struct {
	// Handle is the object synchronized on: the stream (cuStreamSynchronize,
	// cuStreamWaitEvent), the event (cuEventSynchronize, cuEventRecord), the
	// context passed to cuCtxSynchronize_v2 (0 there means the current
	// context) or 0 for the current context (cuCtxSynchronize).
	Handle uint64
	// Other is the second handle where the call takes two: the event waited
	// on by cuStreamWaitEvent, the stream recorded on by cuEventRecord.
	Other uint64
	// Duration is the time from the call's entry to its return in ns.
	Duration uint64
	// Result is the CUresult the call returned (0 is CUDA_SUCCESS).
	Result int32
}

// Proc describes a process lifecycle event.
type Proc struct {
	// PPID is the parent's process id (exec events).
	PPID uint32
	// Comm is the task name, NUL-padded as the kernel keeps it.
	Comm [16]byte
	// ExitCode is the wait status code of an exit event.
	ExitCode int32
}

// CommString returns Comm up to its first NUL byte.
func (p *Proc) CommString() string {
	for i, c := range p.Comm {
		if c == 0 {
			return string(p.Comm[:i])
		}
	}
	return string(p.Comm[:])
}

// RM describes a traced NVIDIA Resource Manager call on the driver's control
// device: an object allocation, a free, or a control the application issued
// itself (for example CUDA setting its own channel-group timeslice).
type RM struct {
	// FD is the application's descriptor the ioctl was issued on.
	FD int32
	// Status is RM's NV_STATUS for the call (0 is NV_OK).
	Status uint32
	// Client is the RM client handle (hRoot / hClient).
	Client uint32
	// Parent is the parent object of an allocation or free.
	Parent uint32
	// Object is the allocated, freed or controlled object.
	Object uint32
	// Class is the allocated object's class (alloc events).
	Class uint32
	// EngineType is a channel group's engine type (alloc of a TSG), else 0.
	EngineType uint32
	// Cmd is the control command (control events).
	Cmd uint32
	// Value is a control's scalar parameter where it has one (for example
	// the timeslice in µs of SET_TIMESLICE), and for the allocation of a
	// device (class 0x80) or subdevice (0x2080) its instance (deviceId,
	// subDeviceId).
	Value uint64
}
