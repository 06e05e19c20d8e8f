package cudastub

import (
	"os"
	"sync"
	"testing"
)

// testBuild is the one build shared by all tests of a test binary. It is the
// package's only mutable state, and exists only so that ForTest compiles
// once per binary rather than once per test.
var testBuild struct {
	once sync.Once
	b    *Build
	err  error
}

// ForTest returns the stub driver built once per test binary into a
// temporary directory, failing tb if it does not build. The directory is
// left for the operating system's temp cleaning, since no test can know it
// is the last to use it.
func ForTest(tb testing.TB) *Build {
	tb.Helper()
	testBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "arbiter-cudastub-")
		if err != nil {
			testBuild.err = err
			return
		}
		testBuild.b, testBuild.err = BuildAt(dir)
	})
	if testBuild.err != nil {
		tb.Fatalf("build the stub CUDA driver: %v", testBuild.err)
	}
	return testBuild.b
}
