package nvrm

import (
	"os"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// TestMain runs the package's tests, as root, in a mount namespace where
// neither tracefs nor debugfs is mounted: attaching must not need them.
func TestMain(m *testing.M) {
	os.Exit(testenv.MainWithoutTracefs(m))
}
