package workload

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/gpu-arbiter/arbiter/trace"
)

// traceMagic starts every trace file (docs/trace-format.md).
var traceMagic = []byte("ARBTRACE")

// IsTrace reports whether data starts like a trace recorded by `arbiter
// trace --record` rather than a spec.
func IsTrace(data []byte) bool { return bytes.HasPrefix(data, traceMagic) }

// TraceProcess is one process found in a trace: what a spec needs to
// select it for replay.
type TraceProcess struct {
	PID uint32
	// Comm is its name, from its exec event or the trace's name record
	// ("" if the trace holds neither).
	Comm string
	// Calls counts its launches, copies and synchronizations.
	Calls uint64
	// First and Last are when its first and last call began (ns, the
	// trace's clock).
	First, Last uint64
}

// TraceProcesses lists the processes of a trace that made driver calls,
// in order of their first call.
func TraceProcesses(r io.Reader) ([]TraceProcess, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	var out []TraceProcess
	idx := map[uint32]int{}
	comm := map[uint32]string{}
	var ev trace.Event
	for {
		err := tr.Read(&ev)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch ev.Kind {
		case trace.KindExec:
			comm[ev.PID] = ev.Proc.CommString()
			continue
		case trace.KindLaunch, trace.KindCopy, trace.KindSync:
		default:
			continue
		}
		i, ok := idx[ev.PID]
		if !ok {
			if len(out) >= 4096 {
				return nil, fmt.Errorf("more than %d processes in the trace", len(out))
			}
			i = len(out)
			idx[ev.PID] = i
			out = append(out, TraceProcess{PID: ev.PID, First: ev.Time})
		}
		out[i].Calls++
		out[i].Last = max(out[i].Last, ev.Time)
	}
	for i := range out {
		p := &out[i]
		if c, ok := comm[p.PID]; ok {
			p.Comm = c
		} else if c, ok := tr.Name(p.PID); ok {
			p.Comm = c
		}
	}
	return slices.Clip(out), nil
}
