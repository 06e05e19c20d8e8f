package trace

import "fmt"

// Func identifies one exported CUDA driver API entry point that Arbiter
// probes. Every per-thread-stream (_ptsz, _ptds) and versioned (_v2) form is
// its own Func so a trace says exactly which symbol the application called.
// Values are part of the trace-file and ring-buffer formats: never renumber,
// only append.
type Func uint8

// Probed driver API functions.
const (
	FuncNone Func = iota

	FuncLaunchKernel
	FuncLaunchKernelPtsz
	FuncLaunchKernelEx
	FuncLaunchKernelExPtsz
	FuncLaunchCooperativeKernel
	FuncLaunchCooperativeKernelPtsz
	FuncGraphLaunch
	FuncGraphLaunchPtsz

	FuncMemcpyHtoD
	FuncMemcpyHtoDV2
	FuncMemcpyHtoDV2Ptds
	FuncMemcpyHtoDAsync
	FuncMemcpyHtoDAsyncV2
	FuncMemcpyHtoDAsyncV2Ptsz
	FuncMemcpyDtoH
	FuncMemcpyDtoHV2
	FuncMemcpyDtoHV2Ptds
	FuncMemcpyDtoHAsync
	FuncMemcpyDtoHAsyncV2
	FuncMemcpyDtoHAsyncV2Ptsz

	FuncStreamSynchronize
	FuncStreamSynchronizePtsz
	FuncCtxSynchronize
	FuncEventSynchronize
	FuncStreamWaitEvent
	FuncStreamWaitEventPtsz
	FuncEventRecord
	FuncEventRecordPtsz
	FuncEventRecordWithFlags
	FuncEventRecordWithFlagsPtsz
	// FuncCtxSynchronizeV2 is cuCtxSynchronize_v2(CUcontext), which CUDA
	// 13's cuda.h maps cuCtxSynchronize to: cudart 13 calls it, not the
	// argument-less original. Older drivers do not export it.
	FuncCtxSynchronizeV2

	funcCount
)

// FuncInfo describes a probed function: its exported symbol name, the event
// kind it produces and, for copies, the direction.
type FuncInfo struct {
	Symbol string
	Kind   Kind
	Dir    CopyDir
	// Async is true for copies and launches that take a stream argument.
	Async bool
}

var funcInfo = [funcCount]FuncInfo{
	FuncLaunchKernel:                {"cuLaunchKernel", KindLaunch, CopyUnknown, true},
	FuncLaunchKernelPtsz:            {"cuLaunchKernel_ptsz", KindLaunch, CopyUnknown, true},
	FuncLaunchKernelEx:              {"cuLaunchKernelEx", KindLaunch, CopyUnknown, true},
	FuncLaunchKernelExPtsz:          {"cuLaunchKernelEx_ptsz", KindLaunch, CopyUnknown, true},
	FuncLaunchCooperativeKernel:     {"cuLaunchCooperativeKernel", KindLaunch, CopyUnknown, true},
	FuncLaunchCooperativeKernelPtsz: {"cuLaunchCooperativeKernel_ptsz", KindLaunch, CopyUnknown, true},
	FuncGraphLaunch:                 {"cuGraphLaunch", KindLaunch, CopyUnknown, true},
	FuncGraphLaunchPtsz:             {"cuGraphLaunch_ptsz", KindLaunch, CopyUnknown, true},

	FuncMemcpyHtoD:            {"cuMemcpyHtoD", KindCopy, CopyHtoD, false},
	FuncMemcpyHtoDV2:          {"cuMemcpyHtoD_v2", KindCopy, CopyHtoD, false},
	FuncMemcpyHtoDV2Ptds:      {"cuMemcpyHtoD_v2_ptds", KindCopy, CopyHtoD, false},
	FuncMemcpyHtoDAsync:       {"cuMemcpyHtoDAsync", KindCopy, CopyHtoD, true},
	FuncMemcpyHtoDAsyncV2:     {"cuMemcpyHtoDAsync_v2", KindCopy, CopyHtoD, true},
	FuncMemcpyHtoDAsyncV2Ptsz: {"cuMemcpyHtoDAsync_v2_ptsz", KindCopy, CopyHtoD, true},
	FuncMemcpyDtoH:            {"cuMemcpyDtoH", KindCopy, CopyDtoH, false},
	FuncMemcpyDtoHV2:          {"cuMemcpyDtoH_v2", KindCopy, CopyDtoH, false},
	FuncMemcpyDtoHV2Ptds:      {"cuMemcpyDtoH_v2_ptds", KindCopy, CopyDtoH, false},
	FuncMemcpyDtoHAsync:       {"cuMemcpyDtoHAsync", KindCopy, CopyDtoH, true},
	FuncMemcpyDtoHAsyncV2:     {"cuMemcpyDtoHAsync_v2", KindCopy, CopyDtoH, true},
	FuncMemcpyDtoHAsyncV2Ptsz: {"cuMemcpyDtoHAsync_v2_ptsz", KindCopy, CopyDtoH, true},

	FuncStreamSynchronize:        {"cuStreamSynchronize", KindSync, CopyUnknown, false},
	FuncStreamSynchronizePtsz:    {"cuStreamSynchronize_ptsz", KindSync, CopyUnknown, false},
	FuncCtxSynchronize:           {"cuCtxSynchronize", KindSync, CopyUnknown, false},
	FuncEventSynchronize:         {"cuEventSynchronize", KindSync, CopyUnknown, false},
	FuncStreamWaitEvent:          {"cuStreamWaitEvent", KindSync, CopyUnknown, false},
	FuncStreamWaitEventPtsz:      {"cuStreamWaitEvent_ptsz", KindSync, CopyUnknown, false},
	FuncEventRecord:              {"cuEventRecord", KindSync, CopyUnknown, false},
	FuncEventRecordPtsz:          {"cuEventRecord_ptsz", KindSync, CopyUnknown, false},
	FuncEventRecordWithFlags:     {"cuEventRecordWithFlags", KindSync, CopyUnknown, false},
	FuncEventRecordWithFlagsPtsz: {"cuEventRecordWithFlags_ptsz", KindSync, CopyUnknown, false},
	FuncCtxSynchronizeV2:         {"cuCtxSynchronize_v2", KindSync, CopyUnknown, false},
}

// Funcs returns every probed function, in Func order.
func Funcs() []Func {
	fs := make([]Func, 0, funcCount-1)
	for f := FuncNone + 1; f < funcCount; f++ {
		fs = append(fs, f)
	}
	return fs
}

// Valid reports whether f names a probed function.
func (f Func) Valid() bool { return f > FuncNone && f < funcCount }

// Info returns f's description; the zero FuncInfo for an invalid f.
func (f Func) Info() FuncInfo {
	if f.Valid() {
		return funcInfo[f]
	}
	return FuncInfo{}
}

// String returns the exported symbol name, e.g. "cuLaunchKernel_ptsz".
func (f Func) String() string {
	if f.Valid() {
		return funcInfo[f].Symbol
	}
	if f == FuncNone {
		return "none"
	}
	return fmt.Sprintf("func(%d)", uint8(f))
}

// FuncBySymbol returns the Func whose exported symbol is name.
func FuncBySymbol(name string) (Func, bool) {
	for f := FuncNone + 1; f < funcCount; f++ {
		if funcInfo[f].Symbol == name {
			return f, true
		}
	}
	return FuncNone, false
}
