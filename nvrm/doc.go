// Package nvrm owns Arbiter's interface to the NVIDIA Resource Manager (RM),
// the object model behind the driver's /dev/nvidiactl: the ABI (ioctl
// request numbers, parameter structs, class ids, channel-group controls and
// NV_STATUS codes), a per-process registry of RM handles learnt by tracing
// each process's own allocation ioctls with eBPF, and channel control of
// another process's channel groups.
//
// Channel control works on a stock driver, with no patch and nothing loaded
// into the application: RM accepts a call on a client only from the open
// file the client was created on, so the Controller takes the target's own
// file with pidfd_open and pidfd_getfd, issues the channel-group controls on
// the duplicate and closes it at once. It needs root or CAP_SYS_PTRACE, and
// it can act only on processes whose allocations the Tracer saw: no RM call
// lists a client's objects, and handles are never guessed. It works with the
// drivers whose layouts were checked, 535.43.02 to 595.45.04 (LayoutFor
// refuses others), and under the driver's default strict client validation
// (DetectClientValidation).
//
// The facts of the interface, and what remains to be checked on hardware,
// are in docs/nvrm.md.
package nvrm
