package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/web"
)

// daemonClient reads the daemon's API through its root-only unix socket,
// as docker ps reads dockerd's.
type daemonClient struct {
	socket string
	http   *http.Client
}

func newDaemonClient(socket string) *daemonClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &daemonClient{socket: socket, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// get decodes GET /api/v1/path into v, with errors that say what to do.
func (c *daemonClient) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://arbiter/api/v1/"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	switch {
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("no arbiter daemon answers on %s: is it running? (systemctl status arbiter, or start it with arbiter run; --socket names another socket)", c.socket)
	case errors.Is(err, syscall.EACCES) || errors.Is(err, os.ErrPermission):
		return exitError{code: 77, err: fmt.Errorf("%s is the daemon's root-only socket: run this command as root (sudo)", c.socket)}
	case err != nil:
		return fmt.Errorf("ask the daemon on %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read the daemon's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		return fmt.Errorf("daemon answered %s: %s", resp.Status, e.Error)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decode the daemon's answer to %s: %w", path, err)
	}
	return nil
}

// exitError carries an exit status.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// ExitCode implements exitCoder.
func (e exitError) ExitCode() int { return e.code }

// defaultSocket is the socket of the daemon's configuration.
func defaultSocket() string {
	cfg, _, err := config.Resolve("")
	if err != nil {
		return config.Default().Socket
	}
	return cfg.Socket
}

func newPsCmd() *cobra.Command {
	var socket, format string
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List the CUDA processes the daemon manages: class, level, state, GPU, latency and SLO",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return usageErrorf("--format %q: want table or json", format)
			}
			var pl web.ProcessList
			if err := newDaemonClient(socket).get(cmd.Context(), "processes", &pl); err != nil {
				return err
			}
			if format == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(pl)
			}
			return writePs(cmd.OutOrStdout(), pl.Processes)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultSocket(), "the daemon's unix socket")
	cmd.Flags().StringVar(&format, "format", "table", "output: table or json")
	return cmd
}

// writePs prints the process table: one row per process, and below it why
// each process not fully enforced is not.
func writePs(w io.Writer, ps []web.ProcessItem) error {
	sort.Slice(ps, func(i, j int) bool { return ps[i].PID < ps[j].PID })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tCOMM\tCLASS\tLEVEL\tSTATE\tGPU\tREQUESTS\tP50\tP99\tSLO")
	var notes []string
	for _, p := range ps {
		state := p.State
		if p.Unmanaged {
			state = "unmanaged"
		}
		slo := "-"
		if p.Attainment != nil {
			slo = fmt.Sprintf("%.1f%%", 100**p.Attainment)
		}
		lat := func(s float64) string {
			if p.Requests == 0 {
				return "-"
			}
			return time.Duration(s * 1e9).Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", p.PID, printable(p.Comm), printable(p.Class), p.Level, state,
			gpuList(p.GPUs), p.Requests, lat(p.P50Seconds), lat(p.P99Seconds), slo)
		switch {
		case p.Unmanaged && p.UnmanagedReason != "":
			notes = append(notes, fmt.Sprintf("%d: unmanaged: %s", p.PID, printable(p.UnmanagedReason)))
		case p.Limit != "":
			// The limit says both levels ("gate instead of suspend: why",
			// "suspend not supported: why").
			notes = append(notes, fmt.Sprintf("%d: %s", p.PID, printable(p.Limit)))
		}
		if p.Fallback != "" {
			notes = append(notes, fmt.Sprintf("%d: policy decision not used, default applied: %s", p.PID, printable(p.Fallback)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ps) == 0 {
		_, err := fmt.Fprintln(w, "(no CUDA process seen yet)")
		return err
	}
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return err
		}
	}
	return nil
}

func gpuList(g []int) string {
	if len(g) == 0 {
		return "-"
	}
	s := make([]string, len(g))
	for i, x := range g {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// printable keeps a process-given string from steering the terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

func newStatusCmd() *cobra.Command {
	var socket, format string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the daemon's state: node, policy, enforcement levels, processes per class and state, engine counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "text" && format != "json" {
				return usageErrorf("--format %q: want text or json", format)
			}
			var st web.StatusView
			if err := newDaemonClient(socket).get(cmd.Context(), "status", &st); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if format == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			return writeStatus(out, st)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultSocket(), "the daemon's unix socket")
	cmd.Flags().StringVar(&format, "format", "text", "output: text or json")
	return cmd
}

// writeBundle says where the policy comes from when a bundle server
// serves it, and how polling it goes.
func writeBundle(w io.Writer, b *web.BundleStatus) {
	from := map[string]string{"bundle": "fetched", "saved": "saved by the last run", "fallback": "observe-only until a bundle passes"}[b.Origin]
	fmt.Fprintf(w, "  bundle %s: %s", printable(b.URL), from)
	if b.Signature != "" {
		fmt.Fprintf(w, ", signature %s", b.Signature)
	}
	if !b.LastFetchAt.IsZero() {
		fmt.Fprintf(w, "; last fetch %s ago: %s", time.Since(b.LastFetchAt).Round(time.Second), b.LastResult)
	}
	fmt.Fprintln(w)
	if b.LastFetchError != "" {
		fmt.Fprintf(w, "  fetches failing (%d in a row): %s\n", b.ConsecutiveFailures, printable(b.LastFetchError))
	}
}

func writeStatus(w io.Writer, st web.StatusView) error {
	ready := "ready"
	if !st.Ready {
		ready = "NOT READY"
	}
	fmt.Fprintf(w, "arbiter %s on %s: %s, up %s\n", st.Version, printable(st.Node.Hostname), ready, time.Duration(st.UptimeSeconds*1e9).Round(time.Second))
	if st.Policy != nil {
		fmt.Fprintf(w, "policy: revision %s (%s), %s, %d rejected\n", st.Policy.Revision, counted(len(st.Policy.Files), "file", "files"),
			counted(int(st.Policy.Reloads), "reload", "reloads"), st.Policy.Rejected)
		if b := st.Policy.Bundle; b != nil {
			writeBundle(w, b)
		}
		if st.Policy.LastError != "" {
			fmt.Fprintf(w, "  last change rejected: %s\n", printable(st.Policy.LastError))
		}
	}
	fmt.Fprint(w, counted(len(st.Node.GPUs), "GPU", "GPUs"))
	if st.Node.DriverVersion != "" {
		fmt.Fprintf(w, ", driver %s", st.Node.DriverVersion)
	}
	fmt.Fprintln(w)
	for _, l := range st.Node.Levels {
		if l.Supported {
			fmt.Fprintf(w, "  %-9s supported\n", l.Level)
		} else {
			fmt.Fprintf(w, "  %-9s not supported: %s\n", l.Level, l.Reason)
		}
	}
	c := st.Counts
	fmt.Fprintf(w, "processes: %d", c.Processes)
	if c.Unmanaged > 0 {
		// Counted in their classes too; ps says which and why.
		fmt.Fprintf(w, " (%d unmanaged: arbiter ps says which and why)", c.Unmanaged)
	}
	fmt.Fprintln(w)
	classes := make([]string, 0, len(c.Classes))
	for k := range c.Classes {
		classes = append(classes, k)
	}
	sort.Strings(classes)
	for _, k := range classes {
		var parts []string
		for s, n := range c.Classes[k] {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "  %-20s %s\n", printable(k), strings.Join(parts, ", "))
	}
	e := st.Engine
	_, err := fmt.Fprintf(w, "engine: %s, %s, %s, %s, %s, %s recorded\n",
		counted(int(e.Events), "event", "events"), counted(int(e.Requests), "request", "requests"),
		counted(int(e.Suspends), "suspend", "suspends"), counted(int(e.Gates), "gate", "gates"),
		counted(int(e.EnforceErrors), "enforcement error", "enforcement errors"),
		counted(int(st.PreemptionsTotal), "preemption", "preemptions"))
	return err
}
