//go:build cgo

package gpu

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// noInstance is NVML's MIG instance id for a process outside MIG.
const noInstance = 0xFFFFFFFF

// memoryNotAvailable is NVML_VALUE_NOT_AVAILABLE as a process's memory.
const memoryNotAvailable = ^uint64(0)

// Processes implements Inventory: the compute and graphics processes of
// every GPU, each with its memory and its newest utilization sample after
// since.
func (n *NVML) Processes(since time.Time) (ProcessTable, error) {
	unlock, err := n.enter()
	if err != nil {
		return ProcessTable{}, err
	}
	defer unlock()
	var t ProcessTable
	r := recorder{missing: n.missing, out: &t.Unsupported}
	for i, d := range n.devices {
		procs, err := n.gpuProcesses(r, i, d, since)
		if err != nil {
			return ProcessTable{}, err
		}
		t.Processes = append(t.Processes, procs...)
	}
	return t, nil
}

// gpuProcesses reads the processes of GPU i.
func (n *NVML) gpuProcesses(r recorder, i int, d nvml.Device, since time.Time) ([]Process, error) {
	byPID := map[uint32]*Process{}
	unknown := map[uint32]string{} // pid -> the call that could not tell its memory
	add := func(infos []nvml.ProcessInfo, graphics bool, call string) {
		for _, info := range infos {
			p := byPID[info.Pid]
			if p == nil {
				p = &Process{PID: int(info.Pid), GPU: i, GPUInstance: instance(info.GpuInstanceId), ComputeInstance: instance(info.ComputeInstanceId)}
				byPID[info.Pid] = p
			}
			if graphics {
				p.Graphics = true
			} else {
				p.Compute = true
			}
			// A process with both contexts is listed in both lists with
			// the memory of the whole process: take it once.
			if info.UsedGpuMemory == memoryNotAvailable {
				unknown[info.Pid] = call
			} else {
				p.MemoryBytes = max(p.MemoryBytes, info.UsedGpuMemory)
			}
		}
	}
	compute, ret := d.GetComputeRunningProcesses()
	if ok, err := r.field(i, "compute_processes", "nvmlDeviceGetComputeRunningProcesses", ret); err != nil {
		return nil, err
	} else if ok {
		add(compute, false, "nvmlDeviceGetComputeRunningProcesses")
	}
	if r.has(i, "graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses") {
		graphics, ret := d.GetGraphicsRunningProcesses()
		if ok, err := r.field(i, "graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses", ret); err != nil {
			return nil, err
		} else if ok {
			add(graphics, true, "nvmlDeviceGetGraphicsRunningProcesses")
		}
	}
	if err := n.utilization(r, i, d, since, byPID); err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(byPID))
	for _, p := range byPID {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Process) int { return cmp.Compare(a.PID, b.PID) })
	for _, p := range out {
		if call, ok := unknown[uint32(p.PID)]; ok && p.MemoryBytes == 0 {
			*r.out = append(*r.out, Unsupported{GPU: i, Field: fmt.Sprintf("memory of pid %d", p.PID),
				Call: call, Reason: "NVML gives it as not available"})
		}
	}
	return out, nil
}

// utilization attaches to each process its newest sample after since.
// NVML answers NOT_FOUND when it has no sample after since.
func (n *NVML) utilization(r recorder, i int, d nvml.Device, since time.Time, byPID map[uint32]*Process) error {
	const call = "nvmlDeviceGetProcessUtilization"
	if len(byPID) == 0 || !r.has(i, "utilization", call) {
		return nil
	}
	var last uint64
	if !since.IsZero() {
		last = uint64(since.UnixMicro())
	}
	samples, ret := d.GetProcessUtilization(last)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil
	}
	if ok, err := r.field(i, "utilization", call, ret); err != nil || !ok {
		return err
	}
	for _, s := range samples {
		p := byPID[s.Pid]
		if p == nil || s.TimeStamp <= last {
			continue
		}
		at := microTime(s.TimeStamp)
		if p.Utilization != nil && !at.After(p.Utilization.At) {
			continue
		}
		p.Utilization = &Utilization{At: at, SM: s.SmUtil, Memory: s.MemUtil, Encoder: s.EncUtil, Decoder: s.DecUtil}
	}
	return nil
}

// instance turns NVML's MIG instance id into ours (-1: none).
func instance(id uint32) int {
	if id == noInstance {
		return -1
	}
	return int(id)
}
