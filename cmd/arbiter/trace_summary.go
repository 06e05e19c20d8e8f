package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// printSummary writes the per-process summary and the tracer's counters
// (stats is nil for a replay) in the output format: a table, or one JSON
// object on one line.
func printSummary(w io.Writer, format string, s *trace.Summary, stats *uprobe.Stats, wall time.Duration) error {
	// Only processes that made driver calls: exec and exit events of every
	// other process on the node would bury them.
	var ps []trace.ProcessSummary
	others := 0
	for _, p := range s.Processes() {
		if p.Requests > 0 {
			ps = append(ps, p)
		} else {
			others++
		}
	}
	if format == "json" {
		return printSummaryJSON(w, s, ps, others, stats, wall)
	}
	fmt.Fprintf(w, "\n%s (requests are busy periods separated by %v idle); %s started or exited\n",
		counted(len(ps), "CUDA process", "CUDA processes"), s.IdleGap(), counted(others, "other process", "other processes"))
	brief := false
	if len(ps) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "PID\tCOMM\tLAUNCHES\tLAUNCHES/S\tCOPIES\tCOPIED\tREQUESTS\tSYNCS\tSYNC TIME\tMAX SYNC\tSYNC ERRORS\tACTIVE\tEXIT\t")
		for _, p := range ps {
			exit := "-"
			if p.Exited {
				exit = strconv.Itoa(int(p.ExitCode))
			}
			rate := "n/a"
			if r, ok := p.LaunchRate(); ok {
				rate = strconv.FormatFloat(r, 'f', 1, 64)
			} else {
				brief = true
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t\n", p.PID, orDash(p.Comm),
				p.Launches, rate, p.Copies, byteSize(p.CopyBytes), p.Requests, p.Syncs,
				roundDur(p.SyncTime), roundDur(p.MaxSync), p.SyncErrors, roundDur(p.Last-p.First), exit)
		}
		tw.Flush()
	}
	if brief {
		fmt.Fprintf(w, "launches/s is n/a for a process active less than %v: too short for a rate\n", trace.MinRateWindow)
	}
	if stats != nil {
		fmt.Fprintf(w, "tracer: %s in %s, %d dropped (ring buffer full), %d undecodable\n",
			counted(int(stats.Events), "event", "events"), wall.Round(time.Millisecond), stats.Drops, stats.DecodeErrors)
	}
	return nil
}

// jsonSummary is the JSON form of the summary. Field names are stable:
// scripts parse them. Kind tells it from an event line.
type jsonSummary struct {
	Kind      string        `json:"kind"`
	IdleGapNS uint64        `json:"idle_gap_ns"`
	Processes []jsonProcess `json:"processes"`
	// OtherProcesses counts processes that started or exited without a
	// driver call.
	OtherProcesses int         `json:"other_processes"`
	Tracer         *jsonTracer `json:"tracer,omitempty"`
}

// jsonProcess is one CUDA process of the summary; times are nanoseconds.
type jsonProcess struct {
	PID      uint32 `json:"pid"`
	Comm     string `json:"comm,omitempty"`
	Launches uint64 `json:"launches"`
	// LaunchesPerS is null for a process active less than MinRateWindow.
	LaunchesPerS *float64 `json:"launches_per_s"`
	Copies       uint64   `json:"copies"`
	CopyBytes    uint64   `json:"copy_bytes"`
	HtoDBytes    uint64   `json:"htod_bytes"`
	DtoHBytes    uint64   `json:"dtoh_bytes"`
	Requests     uint64   `json:"requests"`
	Syncs        uint64   `json:"syncs"`
	SyncTimeNS   uint64   `json:"sync_time_ns"`
	MaxSyncNS    uint64   `json:"max_sync_ns"`
	SyncErrors   uint64   `json:"sync_errors"`
	FirstNS      uint64   `json:"first_ns"`
	ActiveNS     uint64   `json:"active_ns"`
	Exited       bool     `json:"exited"`
	ExitCode     *int32   `json:"exit_code,omitempty"`
}

// jsonTracer holds the live tracer's counters.
type jsonTracer struct {
	Events      uint64 `json:"events"`
	Dropped     uint64 `json:"dropped"`
	Undecodable uint64 `json:"undecodable"`
	WallNS      int64  `json:"wall_ns"`
}

func printSummaryJSON(w io.Writer, s *trace.Summary, ps []trace.ProcessSummary, others int, stats *uprobe.Stats, wall time.Duration) error {
	j := jsonSummary{Kind: "summary", IdleGapNS: uint64(s.IdleGap()), Processes: make([]jsonProcess, 0, len(ps)), OtherProcesses: others}
	for _, p := range ps {
		jp := jsonProcess{PID: p.PID, Comm: p.Comm, Launches: p.Launches, Copies: p.Copies, CopyBytes: p.CopyBytes,
			HtoDBytes: p.HtoDBytes, DtoHBytes: p.DtoHBytes, Requests: p.Requests, Syncs: p.Syncs,
			SyncTimeNS: p.SyncTime, MaxSyncNS: p.MaxSync, SyncErrors: p.SyncErrors,
			FirstNS: p.First, ActiveNS: uint64(p.Active()), Exited: p.Exited}
		if r, ok := p.LaunchRate(); ok {
			jp.LaunchesPerS = &r
		}
		if p.Exited {
			code := p.ExitCode
			jp.ExitCode = &code
		}
		j.Processes = append(j.Processes, jp)
	}
	if stats != nil {
		j.Tracer = &jsonTracer{Events: stats.Events, Dropped: stats.Drops, Undecodable: stats.DecodeErrors, WallNS: int64(wall)}
	}
	return json.NewEncoder(w).Encode(&j)
}

// counted writes n with the singular or plural noun: "1 event", "2 events".
func counted(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// roundDur prints ns to a readable precision.
func roundDur(ns uint64) string {
	d := time.Duration(ns)
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// byteSize prints a byte count in binary units.
func byteSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(n, 10) + " B"
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
