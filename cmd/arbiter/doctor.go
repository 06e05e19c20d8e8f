package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpu-arbiter/arbiter/gpu"
	"github.com/gpu-arbiter/arbiter/internal/preflight"
)

// doctorOptions are the flags of `arbiter doctor`, and the GPU inventory
// its nvml check opens.
type doctorOptions struct {
	format          string
	root            string
	allowUnverified bool
	schema          bool
	// openNVML is nil (the node's NVML) except in tests, which pass
	// go-nvml's mock servers.
	openNVML gpu.Opener
}

// newDoctorCmd builds `arbiter doctor`.
func newDoctorCmd() *cobra.Command {
	o := &doctorOptions{}
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this node can run arbiter, and which enforcement levels it supports",
		Long: `Check that this node can run arbiter, and which enforcement levels it
supports. Run it on a fresh GPU node, or in the DaemonSet pod, with the
privileges arbiter will run with.

Each line is one check: OK, WARN or FAIL, its name, what it found, and,
where it is not OK, what to do. The checks: the kernel version and its BTF,
permission to load BPF programs and to attach perf events (capabilities,
kernel.unprivileged_bpf_disabled, kernel.perf_event_paranoid), the locked
memory limit, the BPF ring buffer and uprobe cookies, uprobes through the
uprobe PMU and raw tracepoints (each attached and detached at once), the RM
ioctl tracer (attached and closed: it shows the attach path it takes and
whether tracefs is mounted), the BPF filesystem, the libcuda copies on the
node and in running processes (containers included) with their versions,
the NVML library, the NVIDIA driver's version against channel control's
version gate, the control device and GPU device nodes, the driver's client
validation, pidfd_getfd and ptrace access (CAP_SYS_PTRACE, Yama), and the
privileges of interleave levels (CAP_SYS_NICE or CAP_SYS_ADMIN) and of the
launch gate (bpf_send_signal, CAP_KILL for SIGCONT).

Then a summary: the levels observe, timeslice, suspend and gate, each
supported unless a check it needs failed, which are named. A WARN refuses
no level.

--format json prints one object: format_version, the checks (name,
status, detail, fix unless OK, needed_by), the levels (level, supported,
blocked_by, warnings) and ready (the exit status's verdict).
format_version changes only when a field is removed or renamed or changes
its meaning. --schema prints the object's JSON Schema (draft 2020-12),
which docs/doctor.schema.json also holds.

--root reads the NVIDIA driver's files (/proc/driver/nvidia,
/sys/module/nvidia), the device nodes (/dev), the processes (/proc) and the
library directories under another root, e.g. the host's root mounted into
a pod. Kernel, BPF and capability checks always test the running kernel
and this process.

Exit status: 0 when every check the observe level needs passed (kernel,
btf, memlock, bpf-permission, perf-permission, ring-buffer, bpf-cookies,
uprobes, raw-tracepoints, libcuda: no FAIL among them), whatever the other
levels' checks found; 1 when one of them failed, so that arbiter could not
capture CUDA calls here; 2 on a usage error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDoctor(o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.format, "format", "text", "output format: text or json (one object: format_version, checks, levels, ready)")
	f.BoolVar(&o.schema, "schema", false, "print the JSON Schema of --format json and exit, checking nothing")
	f.StringVar(&o.root, "root", "/", "root under which the driver's files, /dev, /proc and the library directories are read")
	f.BoolVar(&o.allowUnverified, "allow-unverified-driver", false,
		"accept a driver newer than the newest verified, as arbiter run and arbiter channels do with this flag")
	return cmd
}

// runDoctor makes the checks and prints the report.
func runDoctor(o *doctorOptions, out io.Writer) error {
	if o.format != "text" && o.format != "json" {
		return usageErrorf("--format %q: want text or json", o.format)
	}
	if o.schema {
		_, err := out.Write(preflight.Schema())
		return err
	}
	// A --root that is not there is a mistyped flag, not a node that
	// fails its checks (exit 1, which a readiness probe reads as such).
	if fi, err := os.Stat(o.root); err != nil || !fi.IsDir() {
		why := "not a directory"
		if err != nil {
			why = errors.Unwrap(err).Error()
		}
		return usageErrorf("--root %s: %s (the root the driver's files, /dev, /proc and the library directories are read under; default /)", o.root, why)
	}
	r, err := preflight.Run(&preflight.Options{Root: o.root, AllowUnverifiedDriver: o.allowUnverified, OpenNVML: o.openNVML})
	if err != nil {
		return fmt.Errorf("--root: %w", err)
	}
	if o.format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(r.Document())
	} else {
		err = writeDoctorText(out, r)
	}
	if err != nil {
		return err
	}
	if !r.Ready() {
		return &notReadyError{blockedBy: r.Level(preflight.Observe).BlockedBy}
	}
	return nil
}

// writeDoctorText prints one line per check, then the levels.
func writeDoctorText(out io.Writer, r *preflight.Report) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, c := range r.Checks {
		line := c.Detail
		if c.Status != preflight.OK {
			line += " | fix: " + c.Fix
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Status, c.Name, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nEnforcement levels:")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, l := range r.Levels {
		state := "supported"
		if !l.Supported {
			state = "not supported: " + strings.Join(l.BlockedBy, ", ") + " failed"
		}
		if len(l.Warnings) > 0 {
			state += " (warnings: " + strings.Join(l.Warnings, ", ") + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", l.Level, state)
	}
	return tw.Flush()
}

// notReadyError ends doctor with exit status 1 when the observe level is
// not supported.
type notReadyError struct {
	blockedBy []string
}

// Error names the checks that refuse capture.
func (e *notReadyError) Error() string {
	return fmt.Sprintf("this node cannot capture CUDA calls: %s failed (see the FAIL lines above for what to do)", strings.Join(e.blockedBy, ", "))
}

// ExitCode is 1, the status documented in doctor's help.
func (e *notReadyError) ExitCode() int { return 1 }
