package cudastub

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// ForTest returns the stub driver for tests, failing tb if it does not
// build. Builds are cached under the temporary directory by the hash of the
// sources and flags, so that the many test binaries of one `go test ./...`
// (and later runs) share one build instead of each leaving its own behind.
// A cached build is used only if it is a directory private to this user.
func ForTest(tb testing.TB) *Build {
	tb.Helper()
	testBuild.once.Do(func() {
		testBuild.b, testBuild.err = cachedBuild(os.TempDir())
	})
	if testBuild.err != nil {
		tb.Fatalf("build the stub CUDA driver: %v", testBuild.err)
	}
	return testBuild.b
}

// cachedBuild returns the build for the current sources under parent,
// building it first if needed.
func cachedBuild(parent string) (*Build, error) {
	key, err := sourceKey()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(parent, fmt.Sprintf("arbiter-cudastub-%d-%s", os.Geteuid(), key))
	if b, ok := existing(dir); ok {
		return b, nil
	}
	// Build beside it, then rename into place: a build is visible only
	// once complete, and of two racing builders the second keeps the
	// first's result.
	tmp, err := os.MkdirTemp(parent, "arbiter-cudastub-build-")
	if err != nil {
		return nil, err
	}
	if _, err := BuildAt(tmp); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if b, ok := existing(dir); ok {
			os.RemoveAll(tmp)
			return b, nil
		}
		// The cached directory is unusable (not ours, or damaged while
		// another test binary may be using it): keep a private build.
		return layout(tmp), nil
	}
	b, ok := existing(dir)
	if !ok {
		return nil, fmt.Errorf("cache the stub build: %s is incomplete after the rename", dir)
	}
	return b, nil
}

// existing returns the build in dir if dir is a complete build owned by
// this user and private to it (another user could otherwise plant a
// library that root's tests would load).
func existing(dir string) (*Build, bool) {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return nil, false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return nil, false
	}
	b := layout(dir)
	for _, f := range []string{b.Lib, b.Infer, b.Train, b.GPUTool, filepath.Join(b.Include, "cuda.h")} {
		if _, err := os.Stat(f); err != nil {
			return nil, false
		}
	}
	return b, true
}

// sourceKey hashes everything a build depends on: the embedded sources and
// the compiler flags.
func sourceKey() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(sources, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := sources.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", path, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", errors.Join(errors.New("hash the stub sources"), err)
	}
	fmt.Fprintf(h, "%s\n%s\n", strings.Join(libFlags, " "), strings.Join(progFlags, " "))
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
