package web

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ServeUnix serves on a Unix socket at path until Shutdown. The socket is
// the daemon user's alone (mode 0600; root when run as the service): it is
// made in a private directory beside path and moved into place only then,
// so it is never reachable with looser permissions. A stale socket left by
// a killed daemon is removed; a live one, or any other file at path, is
// refused.
func (s *Server) ServeUnix(path string) error {
	if err := clearSocket(path); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("web: create socket directory %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(dir, ".arbiter-sock-")
	if err != nil {
		return fmt.Errorf("web: make socket in %s: %w", dir, err)
	}
	staged := filepath.Join(tmp, "s")
	l, err := net.Listen("unix", staged)
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("web: listen on %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(staged, 0o600); err != nil {
		l.Close()
		os.RemoveAll(tmp)
		return fmt.Errorf("web: make socket %s root-only: %w", path, err)
	}
	err = os.Rename(staged, path)
	os.RemoveAll(tmp)
	if err != nil {
		l.Close()
		return fmt.Errorf("web: move socket into place at %s: %w", path, err)
	}
	defer os.Remove(path)
	return s.serve(&namedListener{UnixListener: ul, path: path}, nil, s.handler)
}

// clearSocket removes a stale socket at path and refuses a live one or a
// file that is not a socket.
func clearSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("web: check socket path %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("web: %s exists and is not a socket: remove it or choose another socket path", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("web: %s is in use: another arbiter daemon is serving there; stop it first", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("web: remove stale socket %s: %w", path, err)
	}
	return nil
}

// namedListener reports the socket's final path as its address (the
// listener was made at a staging path).
type namedListener struct {
	*net.UnixListener
	path string
}

func (l *namedListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }
