// Package testenv decides whether a privileged test runs, skips or fails.
//
// Tests that need root, eBPF or a particular kernel feature call Skip rather
// than t.Skip: where ARBITER_REQUIRE_BPF is set (CI runs as root and sets
// it), a missing prerequisite fails the test instead of hiding a broken
// probe behind a skip.
package testenv

import (
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf/rlimit"
)

// RequireVar is the environment variable that turns skips into failures.
const RequireVar = "ARBITER_REQUIRE_BPF"

// Required reports whether privileged tests must run in this environment.
func Required() bool { return os.Getenv(RequireVar) != "" }

// Skip skips the test, or fails it where RequireVar is set.
func Skip(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		tb.Fatalf("%s is set but this test cannot run: %s", RequireVar, msg)
	}
	tb.Skip(msg)
}

// Privileged skips (or fails, see Skip) unless the test runs as root, and
// lifts the memlock limit that older kernels apply to eBPF maps.
func Privileged(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Skip(tb, "needs root for eBPF (run the tests as root)")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		Skip(tb, "cannot lift RLIMIT_MEMLOCK: %v", err)
	}
}
