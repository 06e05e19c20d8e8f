package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestLockNodeDaemons: while a test holds the lock another process cannot
// take it; nested holds share it; it is free once every holder ended.
func TestLockNodeDaemons(t *testing.T) {
	flock, err := exec.LookPath("flock")
	if err != nil {
		Skip(t, "flock(1) not installed: apt-get install util-linux")
	}
	path := filepath.Join(os.TempDir(), "arbiter-node-daemons.lock")
	other := func() error { return exec.Command(flock, "-n", path, "true").Run() }
	t.Run("held", func(t *testing.T) {
		LockNodeDaemons(t)
		t.Run("nested", func(t *testing.T) { LockNodeDaemons(t) })
		if other() == nil {
			t.Error("another process took the lock while a test held it (after a nested hold ended)")
		}
	})
	// Other test binaries of the same run may hold it now (their node
	// daemons): wait for them, as they wait for each other. One of this
	// process's holds left behind would keep it past the wait.
	if err := exec.Command(flock, "-w", "300", path, "true").Run(); err != nil {
		t.Errorf("the lock is still held, 5 minutes after every holder in this process ended: %v", err)
	}
}
