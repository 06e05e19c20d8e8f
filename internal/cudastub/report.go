package cudastub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
)

// InferReport is what infer prints as its last line on stdout: the
// requests' latencies over its run.
type InferReport struct {
	Requests int     `json:"requests"`
	Seconds  float64 `json:"seconds"`
	P50US    float64 `json:"p50_us"`
	P99US    float64 `json:"p99_us"`
	MaxUS    float64 `json:"max_us"`
	MeanUS   float64 `json:"mean_us"`
}

// TrainReport is what train prints as its last line on stdout: its
// launches, those seen completed, and the launches it found lost (train
// exits with status 1 when Lost is not 0).
type TrainReport struct {
	Launches     int     `json:"launches"`
	Completed    int     `json:"completed"`
	Seconds      float64 `json:"seconds"`
	LaunchesPerS float64 `json:"launches_per_s"`
	KernelUS     float64 `json:"kernel_us"`
	Lost         int     `json:"lost"`
}

// GPUState is the schedule of one shared emulated GPU as stubgpu prints it.
type GPUState struct {
	GPU        int        `json:"gpu"`
	Segment    string     `json:"segment"`
	ClockNS    uint64     `json:"clock_ns"`
	CurrentPID int        `json:"current_pid"`
	Switches   uint64     `json:"switches"`
	Groups     []GPUGroup `json:"groups"`
}

// GPUGroup is one process's channel group on a shared emulated GPU.
type GPUGroup struct {
	PID         int    `json:"pid"`
	Alive       bool   `json:"alive"`
	TimesliceUS uint64 `json:"timeslice_us"`
	// QueuedNS is the group's work not yet run, BusyNS the GPU time it
	// has used, Items the launches, copies and markers it queued.
	QueuedNS uint64 `json:"queued_ns"`
	BusyNS   uint64 `json:"busy_ns"`
	Items    uint64 `json:"items"`
}

// Group returns pid's group, if it has one.
func (s GPUState) Group(pid int) (GPUGroup, bool) {
	for _, g := range s.Groups {
		if g.PID == pid {
			return g, true
		}
	}
	return GPUGroup{}, false
}

// ParseInferReport reads infer's report from its standard output.
func ParseInferReport(stdout []byte) (InferReport, error) {
	var r InferReport
	return r, parseReport(stdout, "infer", &r)
}

// ParseTrainReport reads train's report from its standard output.
func ParseTrainReport(stdout []byte) (TrainReport, error) {
	var r TrainReport
	return r, parseReport(stdout, "train", &r)
}

// parseReport decodes the last line of a workload's stdout, which must be
// its JSON report.
func parseReport(stdout []byte, workload string, dst any) error {
	lines := bytes.Split(bytes.TrimSpace(stdout), []byte("\n"))
	last := lines[len(lines)-1]
	var head struct {
		Workload string `json:"workload"`
	}
	if err := json.Unmarshal(last, &head); err != nil || head.Workload != workload {
		return fmt.Errorf("read the %s report: its last line of output %q is not a %s JSON report (did it exit early?)",
			workload, last, workload)
	}
	if err := json.Unmarshal(last, dst); err != nil {
		return fmt.Errorf("read the %s report %q: %w", workload, last, err)
	}
	return nil
}

// ReadGPU returns the schedule of GPU index of node ("" for the default
// node, or $ARBITER_STUB_NODE when set in env) through b's stubgpu. env
// adds to the inherited environment.
func ReadGPU(b *Build, node string, index int, env ...string) (GPUState, error) {
	args := []string{"--gpu", strconv.Itoa(index)}
	if node != "" {
		args = append(args, "--node", node)
	}
	cmd := exec.Command(b.GPUTool, args...)
	cmd.Env = append(cmd.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return GPUState{}, fmt.Errorf("read emulated GPU %d: %s: %w: %s", index, b.GPUTool, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var s GPUState
	if err := json.Unmarshal(out, &s); err != nil {
		return GPUState{}, fmt.Errorf("read emulated GPU %d: stubgpu printed %q: %w", index, out, err)
	}
	return s, nil
}
