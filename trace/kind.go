package trace

import "fmt"

// Kind says what an Event records. Values are part of the trace-file format:
// never renumber, only append.
type Kind uint8

// Event kinds.
const (
	KindInvalid Kind = iota
	// KindLaunch is a kernel or graph launch (Event.Launch).
	KindLaunch
	// KindCopy is a host/device memory copy (Event.Copy).
	KindCopy
	// KindSync is a synchronizing call, reported at its return (Event.Sync).
	KindSync
	// KindExec is a process image replaced by exec (Event.Proc).
	KindExec
	// KindExit is a process exit (Event.Proc).
	KindExit
	// KindRMAlloc is a successful RM object allocation (Event.RM).
	KindRMAlloc
	// KindRMFree is an RM object free (Event.RM).
	KindRMFree
	// KindRMControl is an RM control the application issued (Event.RM).
	KindRMControl

	kindCount
)

var kindNames = [kindCount]string{
	KindInvalid:   "invalid",
	KindLaunch:    "launch",
	KindCopy:      "copy",
	KindSync:      "sync",
	KindExec:      "exec",
	KindExit:      "exit",
	KindRMAlloc:   "rm_alloc",
	KindRMFree:    "rm_free",
	KindRMControl: "rm_control",
}

// Valid reports whether k is a known, non-invalid kind.
func (k Kind) Valid() bool { return k > KindInvalid && k < kindCount }

// String returns the kind's lower-case name.
func (k Kind) String() string {
	if k < kindCount {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// CopyDir is the direction of a memory copy.
type CopyDir uint8

// Copy directions.
const (
	CopyUnknown CopyDir = iota
	// CopyHtoD copies host memory to the device.
	CopyHtoD
	// CopyDtoH copies device memory to the host.
	CopyDtoH
)

// String returns "htod", "dtoh" or "unknown".
func (d CopyDir) String() string {
	switch d {
	case CopyHtoD:
		return "htod"
	case CopyDtoH:
		return "dtoh"
	}
	return "unknown"
}
