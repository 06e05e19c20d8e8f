// Command arbiter is Arbiter's daemon and command-line tool: it traces CUDA
// processes with eBPF, classifies them with Rego policies and enforces their
// GPU SLOs through the NVIDIA driver's channel control.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// version is set at link time by the Makefile (-X main.version=...).
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd(version).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, errorText(err))
		var ec exitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

// exitCoder is an error that chooses the process exit status.
type exitCoder interface {
	error
	ExitCode() int
}

// errorText is how main prints a command's error: after "arbiter: ",
// unless it names the command already ("arbiter sim: ..."), and with the
// usage line where the root command was given one it does not have.
func errorText(err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, "unknown command ") && strings.Contains(msg, `for "arbiter"`) && !strings.Contains(msg, "\nusage: ") {
		msg += "\n" + rootUsage
	}
	if strings.HasPrefix(msg, "arbiter ") {
		return msg
	}
	return "arbiter: " + msg
}
