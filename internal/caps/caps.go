// Package caps reports which Linux capabilities the current process holds
// and which kernel features the running kernel has, so commands can name
// exactly the privilege or feature they miss, and how to get it, instead of
// failing with a bare EPERM or "not supported". Both kinds of error make a
// command exit with status 77.
package caps

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Cap is a Linux capability number (see capabilities(7)).
type Cap uint

// Capabilities Arbiter needs.
const (
	SysPtrace Cap = 19 // CAP_SYS_PTRACE: pidfd_getfd of another user's process
	SysAdmin  Cap = 21 // CAP_SYS_ADMIN: eBPF on kernels before 5.8
	SysNice   Cap = 23 // CAP_SYS_NICE: the driver's RS_ACCESS_NICE (interleave levels)
	Perfmon   Cap = 38 // CAP_PERFMON: attaching uprobes and tracepoints
	BPF       Cap = 39 // CAP_BPF: loading programs and maps
)

// String returns the capability's name, e.g. "CAP_BPF".
func (c Cap) String() string {
	switch c {
	case SysPtrace:
		return "CAP_SYS_PTRACE"
	case SysAdmin:
		return "CAP_SYS_ADMIN"
	case SysNice:
		return "CAP_SYS_NICE"
	case Perfmon:
		return "CAP_PERFMON"
	case BPF:
		return "CAP_BPF"
	}
	return fmt.Sprintf("capability %d", uint(c))
}

// Set is a set of effective capabilities.
type Set uint64

// Has reports whether c is in the set.
func (s Set) Has(c Cap) bool { return s&(1<<c) != 0 }

// Effective reads the calling process's effective capability set from
// /proc/self/status.
func Effective() (Set, error) {
	return effectiveFrom("/proc/self/status")
}

func effectiveFrom(path string) (Set, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		hex, ok := strings.CutPrefix(sc.Text(), "CapEff:")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("read capabilities: %s: bad CapEff %q: %w", path, hex, err)
		}
		return Set(v), nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read capabilities: %s: %w", path, err)
	}
	return 0, fmt.Errorf("read capabilities: %s has no CapEff line", path)
}

// Missing returns the capabilities of want that the process lacks. CAP_BPF
// and CAP_PERFMON are each satisfied by CAP_SYS_ADMIN, as the kernel allows,
// and so is CAP_SYS_NICE, as the NVIDIA driver's RS_ACCESS_NICE check
// allows.
func Missing(have Set, want ...Cap) []Cap {
	var out []Cap
	for _, c := range want {
		if have.Has(c) {
			continue
		}
		if (c == BPF || c == Perfmon || c == SysNice) && have.Has(SysAdmin) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// Require returns an error naming every capability of want the calling
// process lacks, with how to get them, or nil when it holds them all. what
// says what needs them, e.g. "tracing CUDA calls".
func Require(what string, want ...Cap) error {
	have, err := Effective()
	if err != nil {
		return err
	}
	return Check(have, what, want...)
}

// Check is Require against a given capability set.
func Check(have Set, what string, want ...Cap) error {
	miss := Missing(have, want...)
	if len(miss) == 0 {
		return nil
	}
	bin, err := os.Executable()
	if err != nil {
		bin = "BINARY"
	}
	return &MissingError{What: what, Caps: miss, Binary: bin}
}

// MissingError says which capabilities an operation lacks.
type MissingError struct {
	// What needs the capabilities, e.g. "tracing CUDA calls".
	What string
	// Caps are the missing capabilities.
	Caps []Cap
	// Binary is the executable to grant them to.
	Binary string
	// Hint, when set, is a further way out appended to the message, e.g.
	// "or use --replay FILE, which needs none".
	Hint string
}

// Error names the missing capabilities and how to obtain them.
func (e *MissingError) Error() string {
	names := make([]string, len(e.Caps))
	lower := make([]string, len(e.Caps))
	for i, c := range e.Caps {
		names[i] = c.String()
		lower[i] = strings.ToLower(c.String())
	}
	msg := fmt.Sprintf("%s needs %s, which this process lacks: run it as root (sudo), or grant the capabilities (setcap %s+ep %s, or the container's securityContext.capabilities.add)",
		e.What, strings.Join(names, " and "), strings.Join(lower, ","), e.Binary)
	if e.Hint != "" {
		msg += ", " + e.Hint
	}
	return msg
}

// ExitCode makes a missing privilege exit with status 77 (EX_NOPERM).
func (e *MissingError) ExitCode() int { return 77 }
