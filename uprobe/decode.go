package uprobe

import (
	"encoding/binary"
	"fmt"

	"github.com/gpu-arbiter/arbiter/trace"
)

// RecordSize is the size in bytes of one ring-buffer record (bpf/cuda.c's
// struct event).
const RecordSize = 96

// kindIFunc marks the tracer-internal record of an IFUNC resolver's return
// (bpf/cuda.c KIND_IFUNC); Decode rejects it like any unknown kind.
const kindIFunc = 0x80

// Offsets of struct event's fields.
const (
	offTime   = 0
	offCgroup = 8
	offArgs   = 16
	offPID    = 48
	offTID    = 52
	offDims   = 56
	offResult = 84
	offKind   = 88
	offFunc   = 89
)

// DecodeError says why a record could not be decoded.
type DecodeError struct {
	// Field is the record field at fault, Offset its byte offset.
	Field  string
	Offset int
	Reason string
}

// Error says which field at which byte offset is wrong and why.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode ring-buffer record: %s at byte %d: %s", e.Field, e.Offset, e.Reason)
}

// Decode fills ev from one raw ring-buffer record. ev is overwritten
// entirely, so a reused Event carries nothing over from the previous record.
// It allocates only when it returns an error.
func Decode(raw []byte, ev *trace.Event) error {
	if len(raw) < RecordSize {
		return &DecodeError{Field: "record", Offset: len(raw), Reason: fmt.Sprintf("short record: %d bytes, want %d", len(raw), RecordSize)}
	}
	raw = raw[:RecordSize]
	le := binary.LittleEndian
	kind := trace.Kind(raw[offKind])
	fn := trace.Func(raw[offFunc])
	*ev = trace.Event{
		Kind:   kind,
		PID:    le.Uint32(raw[offPID:]),
		TID:    le.Uint32(raw[offTID:]),
		Time:   le.Uint64(raw[offTime:]),
		Cgroup: le.Uint64(raw[offCgroup:]),
	}
	arg := func(i int) uint64 { return le.Uint64(raw[offArgs+8*i:]) }
	dim := func(i int) uint32 { return le.Uint32(raw[offDims+4*i:]) }

	switch kind {
	case trace.KindLaunch, trace.KindCopy, trace.KindSync:
		info := fn.Info()
		if !fn.Valid() {
			return &DecodeError{Field: "func", Offset: offFunc, Reason: fmt.Sprintf("unknown function id %d", uint8(fn))}
		}
		if info.Kind != kind {
			return &DecodeError{Field: "kind", Offset: offKind, Reason: fmt.Sprintf("kind %v does not match %s (a %v)", kind, fn, info.Kind)}
		}
		ev.Func = fn
		switch kind {
		case trace.KindLaunch:
			ev.Launch = trace.Launch{
				Function:  arg(0),
				Stream:    arg(1),
				Grid:      [3]uint32{dim(0), dim(1), dim(2)},
				Block:     [3]uint32{dim(3), dim(4), dim(5)},
				SharedMem: dim(6),
			}
		case trace.KindCopy:
			decodeCopy(fn, info, arg(0), arg(1), arg(2), arg(3), &ev.Copy)
		case trace.KindSync:
			ev.Sync = trace.Sync{
				Handle:   arg(0),
				Other:    arg(1),
				Duration: arg(2),
				Result:   int32(le.Uint32(raw[offResult:])),
			}
			// cuCtxSynchronize takes no argument: whatever the registers
			// held is not a handle. The one-handle synchronizers
			// (cuCtxSynchronize_v2's is the context) have no second.
			switch fn {
			case trace.FuncCtxSynchronize:
				ev.Sync.Handle, ev.Sync.Other = 0, 0
			case trace.FuncStreamSynchronize, trace.FuncStreamSynchronizePtsz, trace.FuncEventSynchronize,
				trace.FuncCtxSynchronizeV2:
				ev.Sync.Other = 0
			}
		}
	case trace.KindExec, trace.KindExit:
		if fn != trace.FuncNone {
			return &DecodeError{Field: "func", Offset: offFunc, Reason: fmt.Sprintf("function id %d on a %v record", uint8(fn), kind)}
		}
		copy(ev.Proc.Comm[:], raw[offArgs:offArgs+16])
		if kind == trace.KindExec {
			ev.Proc.PPID = dim(0)
		} else {
			ev.Proc.ExitCode = int32(le.Uint32(raw[offResult:]))
		}
	default:
		return &DecodeError{Field: "kind", Offset: offKind, Reason: fmt.Sprintf("unknown event kind %d", uint8(kind))}
	}
	return nil
}

// decodeCopy maps a copy's first four arguments by the function's layout:
// cuMemcpyHtoD*(dstDevice, srcHost, ByteCount[, hStream]) and
// cuMemcpyDtoH*(dstHost, srcDevice, ByteCount[, hStream]). The v1 forms
// take a 32-bit device pointer and byte count, whose registers' upper
// halves the ABI leaves undefined.
func decodeCopy(fn trace.Func, info trace.FuncInfo, a0, a1, a2, a3 uint64, c *trace.Copy) {
	c.Dir = info.Dir
	c.Bytes = a2
	if info.Dir == trace.CopyDtoH {
		c.Host, c.Device = a0, a1
	} else {
		c.Device, c.Host = a0, a1
	}
	switch fn {
	case trace.FuncMemcpyHtoD, trace.FuncMemcpyHtoDAsync, trace.FuncMemcpyDtoH, trace.FuncMemcpyDtoHAsync:
		c.Device &= 0xffffffff
		c.Bytes &= 0xffffffff
	}
	if info.Async {
		c.Stream = a3
	}
}
