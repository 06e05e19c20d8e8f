// Command arbiter is Arbiter's daemon and command-line tool: it traces CUDA
// processes with eBPF, classifies them with Rego policies and enforces their
// GPU SLOs through the NVIDIA driver's channel control.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at link time by the Makefile (-X main.version=...).
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	out := &countingWriter{f: os.Stdout}
	root := newRootCmd(version)
	countOutput(root, out)
	cmd, err := root.ExecuteContextC(ctx)
	stop()
	if err != nil {
		err = withUsage(rootError(err), cmd)
		code := 1
		var ec exitCoder
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		// Asked for JSON and given nothing: the error is the output, so
		// that a script reading stdout reads JSON either way.
		if out.n == 0 && wantsJSON(cmd) {
			_ = json.NewEncoder(os.Stdout).Encode(jsonError{Error: err.Error(), ExitCode: code})
		}
		fmt.Fprintln(os.Stderr, errorText(err))
		os.Exit(code)
	}
}

// countingWriter is stdout, counting what a command wrote to it.
type countingWriter struct {
	f *os.File
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.f.Write(p)
	c.n += int64(n)
	return n, err
}

// Fd is the file's descriptor, for the commands that ask whether their
// output is a terminal.
func (c *countingWriter) Fd() uintptr { return c.f.Fd() }

// countOutput makes every runnable command below c write its output
// through out once it runs: not while cobra parses the flags, whose
// notices (a deprecated flag) go to stderr, which cobra finds through the
// same setting.
func countOutput(c *cobra.Command, out io.Writer) {
	for _, sub := range c.Commands() {
		countOutput(sub, out)
	}
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(out)
			return run(cmd, args)
		}
	}
}

// wantsJSON reports whether cmd was run with --format json, its stdout
// not taken by something else (a trace recorded to it: --record -).
func wantsJSON(cmd *cobra.Command) bool {
	if cmd == nil {
		return false
	}
	if r := cmd.Flags().Lookup("record"); r != nil && r.Value.String() == "-" {
		return false
	}
	f := cmd.Flags().Lookup("format")
	return f != nil && f.Value.String() == "json"
}

// exitCoder is an error that chooses the process exit status.
type exitCoder interface {
	error
	ExitCode() int
}

// rootError makes cobra's own error for a command the root does not have
// a usage error that names the root's usage.
func rootError(err error) error {
	msg := err.Error()
	if strings.HasPrefix(msg, "unknown command ") && strings.Contains(msg, `for "arbiter"`) && !strings.Contains(msg, "\nusage: ") {
		return usageErrorf("%w\n%s", err, rootUsage)
	}
	return err
}

// withUsage adds the usage line of cmd, the command that ran, to a usage
// error that does not name it yet (a flag value the command refuses:
// "--format xml"), so that every one ends with it.
func withUsage(err error, cmd *cobra.Command) error {
	if _, ok := errors.AsType[*usageError](err); !ok || cmd == nil || strings.Contains(err.Error(), "\nusage: ") {
		return err
	}
	return usageErrorf("%w\nusage: %s", err, cmd.UseLine())
}

// errorText is how main prints a command's error: after "arbiter: ",
// unless it is a usage error that names the command already ("arbiter
// sim: required flag ...").
func errorText(err error) string {
	msg := err.Error()
	if _, ok := errors.AsType[*usageError](err); ok && strings.HasPrefix(msg, "arbiter ") {
		return msg
	}
	return "arbiter: " + msg
}
