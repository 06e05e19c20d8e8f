// Package sdnotify tells systemd how the daemon is doing, through the
// notification protocol of sd_notify(3): one datagram of NAME=VALUE lines
// sent to the unix socket named by $NOTIFY_SOCKET. A unit of Type=notify
// waits for READY=1 before it counts the service as started, and one with
// WatchdogSec= restarts it when WATCHDOG=1 stops coming.
//
// Outside systemd (no $NOTIFY_SOCKET) every call does nothing and returns
// false, nil, so the daemon calls them unconditionally. The package keeps
// no state: each call reads the environment afresh.
package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Environment variables systemd sets for the service.
const (
	SocketVar       = "NOTIFY_SOCKET"
	WatchdogUSecVar = "WATCHDOG_USEC"
	WatchdogPIDVar  = "WATCHDOG_PID"
)

// sendTimeout bounds a send: the daemon must never hang on a full or
// stalled notification socket.
const sendTimeout = time.Second

// Ready says the daemon has started: systemd finishes `systemctl start`
// and starts the units ordered after it.
func Ready() (bool, error) { return Send("READY=1") }

// Stopping says the daemon has begun to shut down.
func Stopping() (bool, error) { return Send("STOPPING=1") }

// Reloading says the daemon has begun to reload its configuration (on
// SIGHUP); send Ready when done. The monotonic timestamp lets systemd 253
// and later match the two.
func Reloading() (bool, error) {
	return Send("RELOADING=1", "MONOTONIC_USEC="+strconv.FormatInt(monotonicUSec(), 10))
}

// Status sets the one-line status `systemctl status` shows. A newline in
// s would start another assignment; it is replaced by a space.
func Status(s string) (bool, error) {
	return Send("STATUS=" + strings.NewReplacer("\n", " ", "\r", " ").Replace(s))
}

// Watchdog tells systemd's watchdog the daemon is alive. Send it at about
// half of WatchdogInterval, from the loop whose progress it vouches for.
func Watchdog() (bool, error) { return Send("WATCHDOG=1") }

// Send sends the given assignments (e.g. "READY=1") in one datagram. It
// returns false, nil when $NOTIFY_SOCKET is not set (not under systemd),
// true, nil once sent, and an error naming the socket when sending failed.
func Send(assignments ...string) (bool, error) {
	name := os.Getenv(SocketVar)
	if name == "" {
		return false, nil
	}
	if len(assignments) == 0 {
		return false, errors.New("sdnotify: nothing to send")
	}
	addr, err := socketAddr(name)
	if err != nil {
		return false, err
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return false, fmt.Errorf("sdnotify: connect to $%s %s (is the service manager still running?): %w", SocketVar, name, err)
	}
	defer conn.Close()
	if err := conn.SetWriteDeadline(time.Now().Add(sendTimeout)); err != nil {
		return false, fmt.Errorf("sdnotify: %s: %w", name, err)
	}
	msg := strings.Join(assignments, "\n")
	if _, err := conn.Write([]byte(msg)); err != nil {
		return false, fmt.Errorf("sdnotify: send %q to $%s %s: %w", msg, SocketVar, name, err)
	}
	return true, nil
}

// socketAddr parses $NOTIFY_SOCKET: an absolute path, or a name in the
// abstract namespace written with a leading '@' (which Go's socket layer
// turns into the leading NUL the kernel expects).
func socketAddr(name string) (*net.UnixAddr, error) {
	switch {
	case strings.HasPrefix(name, "/"), strings.HasPrefix(name, "@") && len(name) > 1:
		return &net.UnixAddr{Name: name, Net: "unixgram"}, nil
	case strings.HasPrefix(name, "vsock:"):
		return nil, fmt.Errorf("sdnotify: $%s=%s is an AF_VSOCK address, which this daemon does not speak; run it in a unix-socket service manager", SocketVar, name)
	}
	return nil, fmt.Errorf("sdnotify: $%s=%q is neither an absolute path nor an abstract socket name (@NAME)", SocketVar, name)
}

// WatchdogInterval returns the watchdog timeout systemd enforces on this
// process (WatchdogSec= of the unit), or 0 when there is none: no
// $WATCHDOG_USEC, or $WATCHDOG_PID names another process (a child that
// inherited the environment). A malformed variable is an error.
func WatchdogInterval() (time.Duration, error) {
	us := os.Getenv(WatchdogUSecVar)
	if us == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(us, 10, 63)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("sdnotify: $%s=%q is not a positive number of microseconds", WatchdogUSecVar, us)
	}
	if p := os.Getenv(WatchdogPIDVar); p != "" {
		pid, err := strconv.Atoi(p)
		if err != nil || pid <= 0 {
			return 0, fmt.Errorf("sdnotify: $%s=%q is not a process id", WatchdogPIDVar, p)
		}
		if pid != os.Getpid() {
			return 0, nil
		}
	}
	return time.Duration(n) * time.Microsecond, nil
}
