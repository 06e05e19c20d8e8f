package gpu

import (
	"errors"
	"fmt"
)

// ErrUnavailable matches (errors.Is) every error that says NVML cannot be
// used on this node at all. The daemon then runs with the GPUs it learns
// from the driver trace.
var ErrUnavailable = errors.New("NVML is not available")

// ErrClosed is returned by every Inventory method after Close.
var ErrClosed = errors.New("GPU inventory is closed")

// fallback is what the daemon does without NVML; every UnavailableError says it.
const fallback = "arbiter runs with the GPUs it learns from the driver trace"

// UnavailableError says why NVML cannot be used and how to make it usable.
// It matches ErrUnavailable.
type UnavailableError struct {
	Reason string // what failed, e.g. the dynamic loader's message
	Fix    string // what to do about it
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%v: %s; %s (to use NVML: %s)", ErrUnavailable, e.Reason, fallback, e.Fix)
}

// Is makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// CallError is an NVML function that failed for a reason other than the
// GPU not supporting it.
type CallError struct {
	GPU  int    // the GPU index; -1 for a system call
	Call string // the NVML function, e.g. "nvmlDeviceGetMemoryInfo"
	Code int    // NVML's return code (nvmlReturn_t)
	Name string // the code's name, e.g. "ERROR_GPU_IS_LOST"
	Hint string // what usually causes it and what to do; may be empty
}

func (e *CallError) Error() string {
	msg := fmt.Sprintf("%s%s: %s", where(e.GPU), e.Call, e.Name)
	if e.Hint != "" {
		msg += " (" + e.Hint + ")"
	}
	return msg
}
