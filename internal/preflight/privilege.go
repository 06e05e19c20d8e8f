package preflight

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
)

// Capabilities only the checks name; package caps has the others.
const (
	capKill        caps.Cap = 5  // CAP_KILL: signals to other users' processes
	capSysResource caps.Cap = 24 // CAP_SYS_RESOURCE: raising RLIMIT_MEMLOCK
)

// YamaPath is where the Yama LSM's ptrace restriction is set; absent where
// Yama is not enabled.
const YamaPath = "/proc/sys/kernel/yama/ptrace_scope"

// checkPidfdGetfd checks what channel control takes a process's control
// file with: the pidfd_open and pidfd_getfd system calls (5.6), tried on
// this process, and the ptrace access they need to another user's
// process: CAP_SYS_PTRACE, and a Yama ptrace_scope below 3.
func checkPidfdGetfd(e *env) result {
	if r, bad := e.capsProblem(); bad {
		return r
	}
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return syscallFailure("pidfd_open", "5.3", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, pidfd, 0)
	if err != nil {
		return syscallFailure("pidfd_getfd", "5.6", err)
	}
	unix.Close(fd)

	yama, scope := "Yama not enabled", -1
	if b, err := os.ReadFile(YamaPath); err == nil {
		fmt.Sscan(strings.TrimSpace(string(b)), &scope)
		yama = fmt.Sprintf("Yama ptrace_scope=%d", scope)
	}
	switch {
	case scope >= 3:
		return result{Fail, "pidfd_getfd works, but " + yama + " forbids attaching to any process, and taking its files with it",
			"set kernel.yama.ptrace_scope to 2 or lower in /etc/sysctl.d and reboot (3 cannot be lowered on a running kernel)"}
	case !e.holds(caps.SysPtrace):
		return result{Fail, "pidfd_getfd works on this process, but CAP_SYS_PTRACE is not held: taking another user's control file needs it (" + yama + ")",
			e.grantFix(caps.SysPtrace)}
	}
	return result{OK, "pidfd_getfd works; CAP_SYS_PTRACE held; " + yama, ""}
}

// syscallFailure explains a system call that failed on this process itself.
func syscallFailure(name, kernel string, err error) result {
	if errors.Is(err, unix.ENOSYS) {
		return result{Fail, fmt.Sprintf("%s: %v: the kernel lacks it", name, err),
			fmt.Sprintf("upgrade the kernel to %s or later", kernel)}
	}
	return result{Fail, fmt.Sprintf("%s on this process itself: %v: a seccomp profile or security module refuses it", name, err),
		"allow pidfd_open and pidfd_getfd in the container's seccomp profile (Docker's default allows them only with CAP_SYS_PTRACE), or run it privileged"}
}

// checkInterleave checks for the driver's RS_ACCESS_NICE, which setting an
// interleave level needs: CAP_SYS_NICE or CAP_SYS_ADMIN. Timeslices work
// without it, so its absence only warns.
func checkInterleave(e *env) result {
	if r, bad := e.capsProblem(); bad {
		return r
	}
	if e.holds(caps.SysNice) {
		return result{OK, heldDetail(e.have, caps.SysNice) + ": interleave levels can be set", ""}
	}
	return result{Warn, "neither CAP_SYS_NICE nor CAP_SYS_ADMIN is held: timeslices can be set, interleave levels are refused by the driver",
		e.grantFix(caps.SysNice)}
}

// checkKill checks for CAP_KILL: the launch gate stops a process from its
// own probe, which needs nothing, but resumes it with SIGCONT, which for
// another user's process needs CAP_KILL. Without it a gated process could
// not be resumed, so the gate is refused.
func checkKill(e *env) result {
	if r, bad := e.capsProblem(); bad {
		return r
	}
	if e.have.Has(capKill) {
		return result{OK, "CAP_KILL held: gated processes of any user can be resumed", ""}
	}
	return result{Fail, "CAP_KILL is not held: a gated process of another user could be stopped but not resumed (SIGCONT)",
		e.grantFix(capKill)}
}

// capsProblem returns a failure when the capability set could not be read.
func (e *env) capsProblem() (result, bool) {
	if e.capsErr == nil {
		return result{}, false
	}
	return result{Fail, e.capsErr.Error(), "make /proc/self/status readable: mount procfs at /proc"}, true
}

// holds reports whether the process holds c, or CAP_SYS_ADMIN where the
// kernel (or the driver, for CAP_SYS_NICE) accepts it instead.
func (e *env) holds(c caps.Cap) bool {
	return e.capsErr == nil && len(caps.Missing(e.have, c)) == 0
}

// heldDetail names the capability that satisfies c: c itself, or
// CAP_SYS_ADMIN in its place.
func heldDetail(have caps.Set, c caps.Cap) string {
	if have.Has(c) {
		return capName(c) + " held"
	}
	return fmt.Sprintf("CAP_SYS_ADMIN held (in place of %s)", capName(c))
}

// grantFix says how to give arbiter the capabilities cs. The setcap
// command is left as setcapMarker, and cs noted in e.missing: Run puts in
// one command for every capability the report finds missing, since setcap
// replaces a file's capabilities and commands run one after another would
// leave only the last one's.
func (e *env) grantFix(cs ...caps.Cap) string {
	names, bare := make([]string, len(cs)), make([]string, len(cs))
	for i, c := range cs {
		names[i] = capName(c)
		bare[i] = strings.TrimPrefix(names[i], "CAP_")
		if !slices.Contains(e.missing, c) {
			e.missing = append(e.missing, c)
		}
	}
	return fmt.Sprintf("run arbiter as root, or grant %s (%s; in a pod, securityContext.capabilities.add: [%s])",
		strings.Join(names, " and "), setcapMarker, strings.Join(bare, ", "))
}

// setcapMarker stands for the setcap command in a fix until Run knows
// every capability missing.
const setcapMarker = "\x00setcap\x00"

// setcapCommand is the one command that grants the capabilities cs to
// the binary, with a word on why it names more than one check's.
func (e *env) setcapCommand(cs []caps.Cap) string {
	lower := make([]string, len(cs))
	for i, c := range cs {
		lower[i] = strings.ToLower(capName(c))
	}
	cmd := fmt.Sprintf("setcap %s+ep %s", strings.Join(lower, ","), e.binary)
	if len(cs) > 1 {
		cmd += ", every capability this report finds missing in one command: setcap replaces a file's capabilities"
	}
	return cmd
}

// capName names c, including the capabilities package caps does not.
func capName(c caps.Cap) string {
	switch c {
	case capKill:
		return "CAP_KILL"
	case capSysResource:
		return "CAP_SYS_RESOURCE"
	}
	return c.String()
}
