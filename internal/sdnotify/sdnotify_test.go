package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listen opens a real unixgram socket at name (a path, or @NAME), as
// systemd does, with SO_PASSCRED so each datagram carries its sender's pid,
// which systemd's NotifyAccess=main checks.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return conn
}

// receive reads one datagram and the pid of its sender.
func receive(t *testing.T, conn *net.UnixConn) (string, int) {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages %v, %v", msgs, err)
	}
	cred, err := unix.ParseUnixCredentials(&msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n]), int(cred.Pid)
}

func TestSendToPathSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	conn := listen(t, path)
	t.Setenv(SocketVar, path)

	cases := []struct {
		name string
		call func() (bool, error)
		want string
	}{
		{"ready", Ready, "READY=1"},
		{"stopping", Stopping, "STOPPING=1"},
		{"watchdog", Watchdog, "WATCHDOG=1"},
		{"status", func() (bool, error) { return Status("tracing 3 processes\non 2 GPUs") }, "STATUS=tracing 3 processes on 2 GPUs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sent, err := tc.call()
			if !sent || err != nil {
				t.Fatalf("= %v, %v; want true, nil", sent, err)
			}
			got, pid := receive(t, conn)
			if got != tc.want {
				t.Errorf("received %q, want %q", got, tc.want)
			}
			if pid != os.Getpid() {
				t.Errorf("sender pid %d, want this process %d (NotifyAccess=main)", pid, os.Getpid())
			}
		})
	}

	sent, err := Reloading()
	if !sent || err != nil {
		t.Fatalf("Reloading = %v, %v", sent, err)
	}
	got, _ := receive(t, conn)
	lines := strings.Split(got, "\n")
	if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
		t.Fatalf("Reloading sent %q", got)
	}
	us, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
	if err != nil || us <= 0 || us > monotonicUSec() {
		t.Fatalf("MONOTONIC_USEC %q is not a past monotonic time (now %d)", lines[1], monotonicUSec())
	}
}

func TestSendToAbstractSocket(t *testing.T) {
	name := fmt.Sprintf("@arbiter-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	conn := listen(t, name)
	t.Setenv(SocketVar, name)
	if sent, err := Ready(); !sent || err != nil {
		t.Fatalf("Ready = %v, %v", sent, err)
	}
	if got, _ := receive(t, conn); got != "READY=1" {
		t.Fatalf("received %q", got)
	}
}

func TestNotUnderSystemd(t *testing.T) {
	t.Setenv(SocketVar, "")
	os.Unsetenv(SocketVar)
	for name, call := range map[string]func() (bool, error){"ready": Ready, "stopping": Stopping, "watchdog": Watchdog, "reloading": Reloading,
		"status": func() (bool, error) { return Status("x") }} {
		if sent, err := call(); sent || err != nil {
			t.Errorf("%s without $%s = %v, %v; want false, nil", name, SocketVar, sent, err)
		}
	}
}

func TestSendErrors(t *testing.T) {
	gone := filepath.Join(t.TempDir(), "gone")
	cases := []struct{ socket, want string }{
		{"relative/notify", "neither an absolute path nor an abstract socket name"},
		{"@", "neither an absolute path nor an abstract socket name"},
		{"vsock:2:1234", "AF_VSOCK"},
		{gone, "connect to $NOTIFY_SOCKET " + gone},
	}
	for _, tc := range cases {
		t.Setenv(SocketVar, tc.socket)
		sent, err := Ready()
		if sent || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NOTIFY_SOCKET=%q: Ready = %v, %v; want an error containing %q", tc.socket, sent, err, tc.want)
		}
	}
	t.Setenv(SocketVar, "/run/x")
	if _, err := Send(); err == nil {
		t.Error("Send() with nothing to send succeeded")
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	cases := []struct {
		usec, pid string
		want      time.Duration
		wantErr   string
	}{
		{"", "", 0, ""},
		{"30000000", "", 30 * time.Second, ""},
		{"30000000", self, 30 * time.Second, ""},
		{"30000000", strconv.Itoa(os.Getpid() + 1), 0, ""},
		{"abc", "", 0, `$WATCHDOG_USEC="abc" is not a positive number`},
		{"0", "", 0, `$WATCHDOG_USEC="0"`},
		{"1000", "me", 0, `$WATCHDOG_PID="me" is not a process id`},
	}
	for _, tc := range cases {
		t.Setenv(WatchdogUSecVar, tc.usec)
		t.Setenv(WatchdogPIDVar, tc.pid)
		got, err := WatchdogInterval()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("USEC=%q PID=%q: err = %v, want %q", tc.usec, tc.pid, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("USEC=%q PID=%q: = %v, %v; want %v", tc.usec, tc.pid, got, err, tc.want)
		}
	}
}
