package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// unitExecVar makes the test binary start a command as systemd starts a
// unit's command (unitExec, JSON), instead of running the tests.
const unitExecVar = "ARBITER_TEST_UNIT_EXEC"

// TestMain runs the tests in a mount namespace of their own (the
// installed root's /proc, /sys and bpffs mounts vanish with it), or, as
// a child, execs a unit's command.
func TestMain(m *testing.M) {
	if spec := os.Getenv(unitExecVar); spec != "" {
		os.Exit(execUnit(spec))
	}
	os.Exit(testenv.MainWithoutTracefs(m))
}

// unitExec is a command started as systemd would start it for the unit,
// with the settings of the unit that a process can apply to itself: the
// root it is installed in (the test's stand-in for the node), the
// capability bounding set, NoNewPrivileges=, UMask=, LimitMEMLOCK=,
// MemoryDenyWriteExecute= (the kernel's PR_SET_MDWE, 6.3+) and the
// environment the service manager gives it. Not applied: the mount
// sandbox (ProtectSystem=, PrivateTmp=, ...), SystemCallFilter= and the
// device policy, which only systemd sets up; docs/install.md says how
// they were checked.
type unitExec struct {
	Root string   `json:"root"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	// Caps is the capability bounding set, by number; nil keeps root's.
	Caps             []int `json:"caps"`
	NoNewPrivileges  bool  `json:"no_new_privileges"`
	Umask            int   `json:"umask"` // -1: unchanged
	MemlockInfinity  bool  `json:"memlock_infinity"`
	DenyWriteExecute bool  `json:"deny_write_execute"`
	// WatchdogUSec, where set, is given with WATCHDOG_PID (the command's
	// own pid: it execs in place).
	WatchdogUSec int64 `json:"watchdog_usec"`
}

// unitCaps are the numbers of the capabilities the unit may name
// (capabilities(7)).
var unitCaps = map[string]int{
	"CAP_DAC_READ_SEARCH": 2, "CAP_KILL": 5, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21,
	"CAP_SYS_NICE": 23, "CAP_SYS_RESOURCE": 24, "CAP_PERFMON": 38, "CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40,
}

// serviceExec returns how systemd would start argv for the [Service]
// section of u, inside root.
func serviceExec(t *testing.T, u unit, root string, argv []string) unitExec {
	t.Helper()
	const svc = "Service"
	e := unitExec{Root: root, Argv: argv, Umask: -1, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}}
	e.Caps = []int{}
	for _, name := range u.words(svc, "CapabilityBoundingSet") {
		n, ok := unitCaps[name]
		if !ok {
			t.Fatalf("CapabilityBoundingSet= names %s, which this test does not know the number of: add it to unitCaps", name)
		}
		e.Caps = append(e.Caps, n)
	}
	e.NoNewPrivileges = u.one(t, svc, "NoNewPrivileges") == "yes"
	if v, err := strconv.ParseInt(u.one(t, svc, "UMask"), 8, 32); err == nil {
		e.Umask = int(v)
	} else {
		t.Fatalf("UMask=: %v", err)
	}
	e.MemlockInfinity = u.one(t, svc, "LimitMEMLOCK") == "infinity"
	e.DenyWriteExecute = u.one(t, svc, "MemoryDenyWriteExecute") == "yes"
	if w := u.one(t, svc, "WatchdogSec"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			t.Fatalf("WatchdogSec=%s: %v", w, err)
		}
		e.WatchdogUSec = d.Microseconds()
	}
	return e
}

// command returns the command that starts e through the test binary.
func (e unitExec) command(t *testing.T) *exec.Cmd {
	t.Helper()
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{unitExecVar + "=" + string(b)}
	return cmd
}

// execUnit applies spec and execs its command; it returns only on
// failure, with the exit status systemd uses for a failed exec (203).
func execUnit(spec string) int {
	var e unitExec
	if err := json.Unmarshal([]byte(spec), &e); err != nil || len(e.Argv) == 0 {
		fmt.Fprintf(os.Stderr, "unit exec: bad spec %q: %v\n", spec, err)
		return 203
	}
	// The bounding set and no_new_privs are per thread, and execve takes
	// the calling thread's.
	runtime.LockOSThread()
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "unit exec: %s: %v\n", what, err)
		return 203
	}
	if e.MemlockInfinity {
		// systemd raises the hard limit; a test without
		// CAP_SYS_RESOURCE (a container's root may lack it) cannot, and
		// says so. Kernels 5.11+ do not count eBPF maps against it.
		switch err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}); {
		case err == unix.EPERM:
			fmt.Fprintln(os.Stderr, "unit exec: LimitMEMLOCK=infinity not applied: raising the hard limit needs CAP_SYS_RESOURCE, which this test lacks")
		case err != nil:
			return fail("LimitMEMLOCK=infinity", err)
		}
	}
	if e.Umask >= 0 {
		unix.Umask(e.Umask)
	}
	last, err := lastCap()
	if err != nil {
		return fail("CapabilityBoundingSet=", err)
	}
	if err := unix.Chroot(e.Root); err != nil {
		return fail("chroot "+e.Root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fail("chdir /", err)
	}
	if e.Caps != nil {
		keep := map[int]bool{}
		for _, c := range e.Caps {
			keep[c] = true
		}
		for c := 0; c <= last; c++ {
			if keep[c] {
				continue
			}
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fail(fmt.Sprintf("CapabilityBoundingSet=: drop capability %d", c), err)
			}
		}
	}
	if e.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fail("NoNewPrivileges=yes", err)
		}
	}
	if e.DenyWriteExecute {
		const prSetMDWE, refuseExecGain = 65, 1
		// Before 6.3 systemd enforces it with a seccomp filter instead,
		// which this does not build: the kernel's refusal (EINVAL) then
		// leaves it unapplied, and says so.
		switch err := unix.Prctl(prSetMDWE, refuseExecGain, 0, 0, 0); {
		case err == unix.EINVAL:
			fmt.Fprintln(os.Stderr, "unit exec: MemoryDenyWriteExecute=yes not applied: the kernel has no PR_SET_MDWE (6.3+)")
		case err != nil:
			return fail("MemoryDenyWriteExecute=yes (PR_SET_MDWE)", err)
		}
	}
	env := e.Env
	if e.WatchdogUSec > 0 {
		env = append(env, fmt.Sprintf("WATCHDOG_USEC=%d", e.WatchdogUSec), fmt.Sprintf("WATCHDOG_PID=%d", os.Getpid()))
	}
	return fail("exec "+e.Argv[0], unix.Exec(e.Argv[0], e.Argv, env))
}

// lastCap is the highest capability number the kernel knows.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
