package nvrm

import (
	"encoding/binary"
	"fmt"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// RecordSize is the size of one record of the tracer's ring buffer
// (struct nvrm_record in bpf/nvrm.c).
const RecordSize = 112

// Offsets of struct nvrm_record's fields.
const (
	recTime      = 0
	recCgroup    = 8
	recPID       = 16
	recTID       = 20
	recFD        = 24
	recRet       = 28
	recKind      = 32
	recXfer      = 33
	recEsc       = 36
	recSize      = 40
	recParamsLen = 44
	recBlock     = 48
	recParams    = 96
	blockMax     = 48
	paramsMax    = 16
)

// DecodeError says which field of a record is wrong and where.
type DecodeError struct {
	// Field names the record field, Offset its byte offset in the record.
	Field  string
	Offset int
	Reason string
}

// Error returns "nvrm: record: field at byte N: reason".
func (e *DecodeError) Error() string {
	return fmt.Sprintf("nvrm: record: %s at byte %d: %s", e.Field, e.Offset, e.Reason)
}

// Decode decodes one ring-buffer record into ev, overwriting it. The
// record's parameter block is the NVOS struct as the driver left it at
// sys_exit; Decode checks that its size matches the call and reads the
// fields the registry needs. It never panics on malformed input.
func Decode(b []byte, ev *trace.Event) error {
	if len(b) != RecordSize {
		return &DecodeError{"record", 0, fmt.Sprintf("length %d, want %d", len(b), RecordSize)}
	}
	le := binary.LittleEndian
	*ev = trace.Event{
		PID:    le.Uint32(b[recPID:]),
		TID:    le.Uint32(b[recTID:]),
		Time:   le.Uint64(b[recTime:]),
		Cgroup: le.Uint64(b[recCgroup:]),
	}
	kind := b[recKind]
	if kind == bpf.NVRMRecordExit {
		ev.Kind = trace.KindExit
		return nil
	}
	esc := le.Uint32(b[recEsc:])
	size := le.Uint32(b[recSize:])
	plen := le.Uint32(b[recParamsLen:])
	if plen > paramsMax {
		return &DecodeError{"params_len", recParamsLen, fmt.Sprintf("%d exceeds %d", plen, paramsMax)}
	}
	blk := b[recBlock : recBlock+blockMax]
	params := b[recParams : recParams+int(plen)]
	rm := &ev.RM
	rm.FD = int32(le.Uint32(b[recFD:]))
	switch kind {
	case bpf.NVRMRecordAlloc:
		if Escape(esc) != EscRMAlloc {
			return &DecodeError{"esc", recEsc, fmt.Sprintf("%#x in an alloc record, want %#x", esc, uint8(EscRMAlloc))}
		}
		ev.Kind = trace.KindRMAlloc
		switch size {
		case 32: // NVOS21
			rm.Status = le.Uint32(blk[28:])
		case 48: // NVOS64
			rm.Status = le.Uint32(blk[40:])
		default:
			return &DecodeError{"size", recSize, fmt.Sprintf("alloc block of %d bytes, want 32 (NVOS21) or 48 (NVOS64)", size)}
		}
		rm.Client = le.Uint32(blk[0:])
		rm.Parent = le.Uint32(blk[4:])
		rm.Object = le.Uint32(blk[8:])
		rm.Class = le.Uint32(blk[12:])
		cls := Class(rm.Class)
		switch {
		case cls.IsClient():
			// A client is its own root: RM returns the new handle in
			// hObjectNew whatever hRoot held.
			rm.Client, rm.Parent = rm.Object, 0
		case cls == ClassChannelGroup:
			if plen >= OffTSGEngineType+4 {
				rm.EngineType = le.Uint32(params[OffTSGEngineType:])
			}
		case cls == ClassDevice || cls == ClassSubdevice:
			if plen >= OffDeviceID+4 {
				rm.Value = uint64(le.Uint32(params[OffDeviceID:]))
			}
		}
	case bpf.NVRMRecordFree:
		if Escape(esc) != EscRMFree || size != 16 {
			return &DecodeError{"esc", recEsc, fmt.Sprintf("free record with escape %#x and size %d, want %#x and 16 (NVOS00)", esc, size, uint8(EscRMFree))}
		}
		ev.Kind = trace.KindRMFree
		rm.Client = le.Uint32(blk[0:])
		rm.Parent = le.Uint32(blk[4:])
		rm.Object = le.Uint32(blk[8:])
		rm.Status = le.Uint32(blk[12:])
	case bpf.NVRMRecordControl:
		if Escape(esc) != EscRMControl || size != 32 {
			return &DecodeError{"esc", recEsc, fmt.Sprintf("control record with escape %#x and size %d, want %#x and 32 (NVOS54)", esc, size, uint8(EscRMControl))}
		}
		ev.Kind = trace.KindRMControl
		rm.Client = le.Uint32(blk[0:])
		rm.Object = le.Uint32(blk[4:])
		rm.Cmd = le.Uint32(blk[8:])
		rm.Status = le.Uint32(blk[28:])
		v, err := controlValue(Control(rm.Cmd), params)
		if err != nil {
			return err
		}
		rm.Value = v
	default:
		return &DecodeError{"kind", recKind, fmt.Sprintf("unknown record kind %d", kind)}
	}
	return nil
}

// controlValue reads a traced control's scalar: GPFIFO_SCHEDULE's bEnable,
// SET_TIMESLICE's µs, PREEMPT's bWait, SET_INTERLEAVE_LEVEL's level.
func controlValue(c Control, p []byte) (uint64, error) {
	var want int
	switch c {
	case CtrlGPFIFOSchedule:
		want = 1
	case CtrlSetTimeslice, CtrlPreempt:
		want = 8
	case CtrlSetInterleaveLevel:
		want = 4
	default:
		return 0, nil
	}
	if len(p) == 0 {
		return 0, nil // the tracer could not read the parameters
	}
	if len(p) < want {
		return 0, &DecodeError{"params_len", recParamsLen, fmt.Sprintf("%d bytes for %s, want %d", len(p), c, want)}
	}
	le := binary.LittleEndian
	switch c {
	case CtrlGPFIFOSchedule:
		return uint64(p[0]), nil
	case CtrlSetTimeslice:
		return le.Uint64(p), nil
	case CtrlPreempt:
		return uint64(p[0]), nil
	}
	return uint64(le.Uint32(p)), nil
}

// EncodeRecord builds a ring-buffer record from its parts, the inverse of
// Decode; tests and benchmarks use it to make traced records without a
// kernel.
func EncodeRecord(kind uint8, pid, tid uint32, fd int32, esc Escape, block, params []byte) []byte {
	b := make([]byte, RecordSize)
	le := binary.LittleEndian
	le.PutUint32(b[recPID:], pid)
	le.PutUint32(b[recTID:], tid)
	le.PutUint32(b[recFD:], uint32(fd))
	b[recKind] = kind
	le.PutUint32(b[recEsc:], uint32(esc))
	le.PutUint32(b[recSize:], uint32(len(block)))
	copy(b[recBlock:recBlock+blockMax], block)
	n := copy(b[recParams:recParams+paramsMax], params)
	le.PutUint32(b[recParamsLen:], uint32(n))
	return b
}
