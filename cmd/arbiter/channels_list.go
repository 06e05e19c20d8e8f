package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/procfs"
)

// newChannelsListCmd builds `arbiter channels list`.
func newChannelsListCmd(o *channelsOptions) *cobra.Command {
	var noQuery bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List CUDA processes with their RM client and channel groups",
		Long: `List prints, per process using the NVIDIA driver, its RM client, the
descriptor the client lives on, and its channel groups with GPU, engine,
timeslice and state. The timeslice is read back from the driver
(GET_TIMESLICE) unless --no-query; the traced value and who set it are shown
beside it.

Handles come from the registry: a pinned tracer left by the daemon or
"channels watch" is drained first; while a daemon runs, its saved state is
read. Processes holding the control device whose allocations were not seen
are listed as unknown.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runChannelsList(o, !noQuery, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().BoolVar(&noQuery, "no-query", false, "do not read timeslices back from the driver")
	return cmd
}

// listedGroup is one row of the listing.
type listedGroup struct {
	Client    string `json:"client"`
	FD        int32  `json:"fd"`
	GPU       uint32 `json:"gpu"`
	Group     string `json:"group"`
	Engine    string `json:"engine"`
	Channels  int    `json:"channels"`
	Timeslice uint64 `json:"timeslice_us,omitempty"`
	// Queried is the timeslice the driver reports, when read.
	Queried     *uint64 `json:"queried_timeslice_us,omitempty"`
	TimesliceBy string  `json:"timeslice_set_by,omitempty"`
	State       string  `json:"state"`
}

// listedProcess is one process of the listing.
type listedProcess struct {
	PID    uint32        `json:"pid"`
	Comm   string        `json:"comm"`
	Known  bool          `json:"known"`
	Reason string        `json:"reason,omitempty"`
	Groups []listedGroup `json:"groups,omitempty"`
	Error  string        `json:"error,omitempty"`
}

func runChannelsList(o *channelsOptions, query bool, stdout, stderr io.Writer) error {
	if o.format != "text" && o.format != "json" {
		return usageErrorf("--format %q: want text or json", o.format)
	}
	if err := o.checkDriver(); err != nil {
		return err
	}
	want := []caps.Cap{caps.BPF, caps.Perfmon}
	if query {
		want = append(want, caps.SysPtrace)
	}
	if err := o.requireCaps("listing channel groups", want...); err != nil {
		return err
	}
	var reg *nvrm.Registry
	var ctrl *nvrm.Controller
	k, warn, err := o.keeper(keeperMode{trace: nvrm.TraceIfPinned, control: query, optional: true})
	if warn != nil {
		fmt.Fprintf(stderr, "warning: %v\n", warn)
	}
	switch {
	case errors.Is(err, nvrm.ErrKeeperRunning):
		// A daemon keeps the registry and saves it after every change.
		fmt.Fprintf(stderr, "note: %v; showing its saved state\n", err)
		if reg, err = nvrm.ReadState(o.stateDir); err != nil {
			return err
		}
	case err != nil:
		return explain(0, err)
	default:
		defer k.Close()
		if k.ResumeErr != nil {
			fmt.Fprintf(stderr, "warning: resuming channel groups a previous run left suspended: %v\n", k.ResumeErr)
		}
		if !k.Tracing() {
			fmt.Fprintln(stderr, "note: no tracer is pinned: handles come from the saved state only (run `arbiter channels watch` or `arbiter run` to trace)")
		}
		reg, ctrl = k.Registry(), k.Controller()
	}
	procs := listProcesses(o, reg, ctrl)
	if o.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(procs)
	}
	return printProcesses(stdout, procs)
}

// listProcesses joins the registry with the processes holding the control
// device, reading timeslices back where ctrl is not nil.
func listProcesses(o *channelsOptions, reg *nvrm.Registry, ctrl *nvrm.Controller) []listedProcess {
	rdev, _ := o.rdev()
	holders := controlHolders(o.procRootDir(), rdev)
	var out []listedProcess
	seen := map[uint32]bool{}
	for _, p := range reg.Processes() {
		seen[p.PID] = true
		lp := listedProcess{PID: p.PID, Comm: procComm(o.procRootDir(), p.PID), Known: true}
		var queried map[uint32]uint64
		if ctrl != nil {
			var err error
			if queried, err = ctrl.Timeslice(p.PID, -1); err != nil && !errors.Is(err, nvrm.ErrNoGroups) {
				lp.Error = explain(p.PID, err).Error()
			}
		}
		for _, c := range p.Clients {
			for _, d := range c.Devices {
				for _, g := range d.Groups {
					lg := listedGroup{
						Client: fmt.Sprintf("%#x", c.Handle), FD: c.FD, GPU: d.Instance, Group: fmt.Sprintf("%#x", g.Handle),
						Engine: g.Engine.String(), Channels: len(g.Channels), Timeslice: g.Timeslice, TimesliceBy: g.TimesliceBy,
						State: groupState(g),
					}
					if v, ok := queried[g.Handle]; ok {
						lg.Queried = &v
					}
					lp.Groups = append(lp.Groups, lg)
				}
			}
		}
		if len(lp.Groups) == 0 {
			lp.Reason = "no channel groups traced yet"
		}
		out = append(out, lp)
	}
	for _, pid := range holders {
		if !seen[pid] {
			out = append(out, listedProcess{PID: pid, Comm: procComm(o.procRootDir(), pid),
				Reason: "handles unknown: its allocations were not traced (started before any Arbiter tracer)"})
		}
	}
	slices.SortFunc(out, func(a, b listedProcess) int { return int(a.PID) - int(b.PID) })
	return out
}

func groupState(g nvrm.Group) string {
	switch {
	case g.Suspended:
		return "suspended"
	case g.Disabled:
		return "disabled"
	}
	return "scheduled"
}

func printProcesses(w io.Writer, procs []listedProcess) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tCOMM\tCLIENT\tFD\tGPU\tGROUP\tENGINE\tCHANNELS\tTIMESLICE\tSTATE")
	for _, p := range procs {
		if len(p.Groups) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t-\t-\t-\t-\t-\t-\t-\t%s\n", p.PID, p.Comm, p.Reason)
		}
		for _, g := range p.Groups {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\n", p.PID, p.Comm, g.Client, g.FD, g.GPU, g.Group, g.Engine, g.Channels, timesliceText(g), g.State)
		}
		if p.Error != "" {
			fmt.Fprintf(tw, "%d\t%s\terror: %s\n", p.PID, p.Comm, strings.ReplaceAll(p.Error, "\n", " "))
		}
	}
	return tw.Flush()
}

// timesliceText shows the driver's value and the traced one.
func timesliceText(g listedGroup) string {
	traced := "default"
	if g.Timeslice != 0 {
		traced = fmt.Sprintf("%dµs by %s", g.Timeslice, g.TimesliceBy)
	}
	if g.Queried != nil {
		return fmt.Sprintf("%dµs (%s)", *g.Queried, traced)
	}
	return traced
}

func (o *channelsOptions) procRootDir() string {
	if o.procRoot != "" {
		return o.procRoot
	}
	return "/proc"
}

// controlHolders returns the processes with a descriptor on the control
// device, by pid.
func controlHolders(procRoot string, rdev nvrm.Rdev) []uint32 {
	proc := procfs.At(procRoot)
	pids, err := proc.PIDs()
	if err != nil {
		return nil
	}
	var out []uint32
	for _, pid := range pids {
		if pid == os.Getpid() || pid >= 1<<31 {
			continue
		}
		fds, err := os.ReadDir(proc.Path(pid, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			var st unix.Stat_t
			if unix.Stat(proc.Path(pid, "fd", fd.Name()), &st) != nil {
				continue
			}
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && nvrm.MkRdev(unix.Major(st.Rdev), unix.Minor(st.Rdev)) == rdev {
				out = append(out, uint32(pid))
				break
			}
		}
	}
	return out
}

// procComm returns a process's name, "?" if it is gone.
func procComm(procRoot string, pid uint32) string {
	comm, err := procfs.At(procRoot).Comm(int(pid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(comm)
}
