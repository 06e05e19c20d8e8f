package cudastub

import (
	"bytes"
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// sources are the header, C files and version script the stub is built
// from. The C files live in csrc/ because the go tool refuses C files in a
// package directory that does not use cgo.
//
//go:embed cuda.h csrc/stub.c csrc/gpu.h csrc/gpu.c csrc/libcuda.map csrc/workload.h csrc/infer.c csrc/train.c csrc/stubgpu.c
var sources embed.FS

// Compiler flags for the library. -fcf-protection=full puts endbr64 first in
// every function; -fno-omit-frame-pointer, -fno-shrink-wrap and
// -fno-optimize-sibling-calls make `push %rbp` the next instruction of every
// probed function (no early-exit test or tail jump before the frame is set
// up), which is the prologue Arbiter's attach-offset choice is tested on.
var libFlags = []string{
	"-shared", "-fPIC", "-O2", "-g0",
	"-fcf-protection=full", "-fno-omit-frame-pointer", "-fno-shrink-wrap", "-fno-optimize-sibling-calls",
	"-fvisibility=hidden", "-Wall", "-Wextra",
	"-Wl,-soname,libcuda.so.1",
}

// Compiler flags for programs linked against the stub.
var progFlags = []string{"-O2", "-fcf-protection=full", "-fno-omit-frame-pointer", "-Wall", "-Wextra"}

// Build is a built stub driver and its workload programs.
type Build struct {
	// Dir holds everything below.
	Dir string
	// Lib is Dir/libcuda.so.1 (Dir/libcuda.so links to it for -lcuda).
	Lib string
	// Include is the directory holding cuda.h (also as cudastub/cuda.h).
	Include string
	// Infer and Train are the workload programs. They find the library
	// through an $ORIGIN run path, so Dir can be moved as a whole.
	Infer string
	Train string
	// GPUTool is stubgpu, which shows (as JSON) or removes the emulated
	// GPU that processes using the stub share.
	GPUTool string
}

// BuildAt compiles the stub library and the workloads into dir (created if
// needed) with the system's gcc. The error carries gcc's output.
func BuildAt(dir string) (*Build, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("build stub driver: %w", err)
	}
	b := layout(dir)
	src := filepath.Join(dir, "src")
	for _, d := range []string{src, filepath.Join(b.Include, "cudastub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("build stub driver: %w", err)
		}
	}
	for _, name := range []string{"cuda.h", "csrc/stub.c", "csrc/gpu.h", "csrc/gpu.c", "csrc/libcuda.map",
		"csrc/workload.h", "csrc/infer.c", "csrc/train.c", "csrc/stubgpu.c"} {
		data, err := sources.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("build stub driver: %w", err)
		}
		dsts := []string{filepath.Join(src, filepath.Base(name))}
		if name == "cuda.h" {
			dsts = append(dsts, filepath.Join(b.Include, "cuda.h"), filepath.Join(b.Include, "cudastub", "cuda.h"))
		}
		for _, dst := range dsts {
			if err := os.WriteFile(dst, data, 0o644); err != nil {
				return nil, fmt.Errorf("build stub driver: %w", err)
			}
		}
	}

	args := append([]string{}, libFlags...)
	args = append(args, "-Wl,--version-script="+filepath.Join(src, "libcuda.map"),
		"-o", b.Lib, filepath.Join(src, "stub.c"), filepath.Join(src, "gpu.c"), "-lpthread", "-lrt")
	if err := gcc(args...); err != nil {
		return nil, fmt.Errorf("build stub driver %s: %w", b.Lib, err)
	}
	link := filepath.Join(dir, "libcuda.so")
	if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("build stub driver: %w", err)
	}
	if err := os.Symlink("libcuda.so.1", link); err != nil {
		return nil, fmt.Errorf("build stub driver: %w", err)
	}
	for _, p := range []struct{ src, out string }{{"infer.c", b.Infer}, {"train.c", b.Train}} {
		if err := compile(b, filepath.Join(src, p.src), p.out, "$ORIGIN"); err != nil {
			return nil, fmt.Errorf("build stub workload %s: %w", filepath.Base(p.out), err)
		}
	}
	args = append(append([]string{}, progFlags...), "-o", b.GPUTool,
		filepath.Join(src, "stubgpu.c"), filepath.Join(src, "gpu.c"), "-lpthread", "-lrt")
	if err := gcc(args...); err != nil {
		return nil, fmt.Errorf("build stubgpu %s: %w", b.GPUTool, err)
	}
	return b, nil
}

// layout returns the paths of a build in dir.
func layout(dir string) *Build {
	return &Build{
		Dir:     dir,
		Lib:     filepath.Join(dir, "libcuda.so.1"),
		Include: filepath.Join(dir, "include"),
		Infer:   filepath.Join(dir, "infer"),
		Train:   filepath.Join(dir, "train"),
		GPUTool: filepath.Join(dir, "stubgpu"),
	}
}

// CompileProgram compiles the C program src into out against the stub: the
// include directory of cuda.h, -lcuda from b.Dir and a run path to it.
// extraFlags go after the source file (defines, more sources, libraries).
func CompileProgram(b *Build, src, out string, extraFlags ...string) error {
	if err := compile(b, src, out, b.Dir, extraFlags...); err != nil {
		return fmt.Errorf("compile %s against the stub driver: %w", src, err)
	}
	return nil
}

func compile(b *Build, src, out, rpath string, extraFlags ...string) error {
	args := append([]string{}, progFlags...)
	args = append(args, "-I", b.Include, "-o", out, src)
	args = append(args, extraFlags...)
	args = append(args, "-L", b.Dir, "-lcuda", "-Wl,-rpath,"+rpath, "-lpthread", "-lm")
	return gcc(args...)
}

// gcc runs the system compiler; a failure carries its output.
func gcc(args ...string) error {
	cmd := exec.Command("gcc", args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		if msg := bytes.TrimSpace(out.Bytes()); len(msg) > 0 {
			return fmt.Errorf("gcc: %w:\n%s", err, msg)
		}
		return fmt.Errorf("gcc: %w (is gcc installed? apt-get install gcc libc6-dev)", err)
	}
	return nil
}
