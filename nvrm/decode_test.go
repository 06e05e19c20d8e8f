package nvrm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"unsafe"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// block encodes a parameter struct as the tracer copies it.
func block(v any) []byte {
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
		panic(err)
	}
	return b.Bytes()
}

func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// tsgParams are a channel group's allocation parameters with engine e.
func tsgParams(e EngineType) []byte {
	return block(ChannelGroupAllocParams{EngineType: uint32(e)})[:16]
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		rec  []byte
		want trace.Event
	}{
		{"client NVOS21", EncodeRecord(bpf.NVRMRecordAlloc, 10, 11, 5, EscRMAlloc, block(NVOS21{HRoot: 0, HObjectNew: 0xC1D00001, HClass: 0x41}), nil),
			trace.Event{Kind: trace.KindRMAlloc, PID: 10, TID: 11, RM: trace.RM{FD: 5, Client: 0xC1D00001, Object: 0xC1D00001, Class: 0x41}}},
		{"device", EncodeRecord(bpf.NVRMRecordAlloc, 10, 10, 5, EscRMAlloc, block(NVOS21{HRoot: 0xC1D00001, HObjectParent: 0xC1D00001, HObjectNew: 0x5C000001, HClass: 0x80}), u32(3)),
			trace.Event{Kind: trace.KindRMAlloc, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 0xC1D00001, Parent: 0xC1D00001, Object: 0x5C000001, Class: 0x80, Value: 3}}},
		{"TSG NVOS64", EncodeRecord(bpf.NVRMRecordAlloc, 10, 10, 5, EscRMAlloc, block(NVOS64{HRoot: 1, HObjectParent: 2, HObjectNew: 3, HClass: 0xA06C}), tsgParams(EngineCopy0+2)),
			trace.Event{Kind: trace.KindRMAlloc, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 1, Parent: 2, Object: 3, Class: 0xA06C, EngineType: 0x0B}}},
		{"TSG params unreadable", EncodeRecord(bpf.NVRMRecordAlloc, 10, 10, 5, EscRMAlloc, block(NVOS21{HRoot: 1, HObjectParent: 2, HObjectNew: 3, HClass: 0xA06C}), nil),
			trace.Event{Kind: trace.KindRMAlloc, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 1, Parent: 2, Object: 3, Class: 0xA06C}}},
		{"free", EncodeRecord(bpf.NVRMRecordFree, 10, 10, 5, EscRMFree, block(NVOS00{1, 2, 3, 0}), nil),
			trace.Event{Kind: trace.KindRMFree, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 1, Parent: 2, Object: 3}}},
		{"set timeslice", EncodeRecord(bpf.NVRMRecordControl, 10, 10, 5, EscRMControl, block(NVOS54{HClient: 1, HObject: 3, Cmd: uint32(CtrlSetTimeslice), ParamsSize: 8}), u64(2048)),
			trace.Event{Kind: trace.KindRMControl, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 1, Object: 3, Cmd: 0xA06C0103, Value: 2048}}},
		{"schedule", EncodeRecord(bpf.NVRMRecordControl, 10, 10, 5, EscRMControl, block(NVOS54{HClient: 1, HObject: 3, Cmd: uint32(CtrlGPFIFOSchedule)}), []byte{1}),
			trace.Event{Kind: trace.KindRMControl, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 1, Object: 3, Cmd: 0xA06C0101, Value: 1}}},
		{"interleave", EncodeRecord(bpf.NVRMRecordControl, 10, 10, 5, EscRMControl, block(NVOS54{HClient: 1, HObject: 3, Cmd: uint32(CtrlSetInterleaveLevel)}), u32(2)),
			trace.Event{Kind: trace.KindRMControl, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 1, Object: 3, Cmd: 0xA06C0107, Value: 2}}},
		{"preempt", EncodeRecord(bpf.NVRMRecordControl, 10, 10, 5, EscRMControl, block(NVOS54{HClient: 1, HObject: 3, Cmd: uint32(CtrlPreempt)}), block(PreemptParams{BWait: 1, TimeoutUs: 9})),
			trace.Event{Kind: trace.KindRMControl, PID: 10, TID: 10, RM: trace.RM{FD: 5, Client: 1, Object: 3, Cmd: 0xA06C0105, Value: 1}}},
		{"exit", EncodeRecord(bpf.NVRMRecordExit, 10, 10, -1, 0, nil, nil),
			trace.Event{Kind: trace.KindExit, PID: 10, TID: 10}},
	}
	for _, tc := range tests {
		var ev trace.Event
		if err := Decode(tc.rec, &ev); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if ev != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, ev, tc.want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	good := EncodeRecord(bpf.NVRMRecordAlloc, 1, 1, 3, EscRMAlloc, block(NVOS21{}), nil)
	mutate := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	tests := []struct {
		name  string
		rec   []byte
		field string
		off   int
	}{
		{"short", good[:50], "record", 0},
		{"long", append(bytes.Clone(good), 0), "record", 0},
		{"kind", mutate(func(b []byte) { b[recKind] = 9 }), "kind", recKind},
		{"params_len", mutate(func(b []byte) { b[recParamsLen] = 17 }), "params_len", recParamsLen},
		{"alloc size", mutate(func(b []byte) { b[recSize] = 16 }), "size", recSize},
		{"alloc esc", mutate(func(b []byte) { b[recEsc] = byte(EscRMFree) }), "esc", recEsc},
		{"free esc", EncodeRecord(bpf.NVRMRecordFree, 1, 1, 3, EscRMAlloc, block(NVOS00{}), nil), "esc", recEsc},
		{"control size", EncodeRecord(bpf.NVRMRecordControl, 1, 1, 3, EscRMControl, block(NVOS64{}), nil), "esc", recEsc},
		{"short timeslice", EncodeRecord(bpf.NVRMRecordControl, 1, 1, 3, EscRMControl, block(NVOS54{Cmd: uint32(CtrlSetTimeslice)}), []byte{1, 2}), "params_len", recParamsLen},
	}
	for _, tc := range tests {
		var ev trace.Event
		err := Decode(tc.rec, &ev)
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("%s: %v, want a DecodeError", tc.name, err)
			continue
		}
		if de.Field != tc.field || de.Offset != tc.off {
			t.Errorf("%s: %v: field %s at %d, want %s at %d", tc.name, err, de.Field, de.Offset, tc.field, tc.off)
		}
	}
}

// FuzzDecode feeds arbitrary records to the decoder: it must return an
// event of a valid kind or an error, never panic.
func FuzzDecode(f *testing.F) {
	f.Add(EncodeRecord(bpf.NVRMRecordAlloc, 1, 1, 3, EscRMAlloc, block(NVOS64{HClass: 0xA06C}), tsgParams(1)))
	f.Add(EncodeRecord(bpf.NVRMRecordAlloc, 1, 1, 3, EscRMAlloc, block(NVOS21{HClass: 0x80}), u32(1)))
	f.Add(EncodeRecord(bpf.NVRMRecordFree, 1, 1, 3, EscRMFree, block(NVOS00{}), nil))
	f.Add(EncodeRecord(bpf.NVRMRecordControl, 1, 1, 3, EscRMControl, block(NVOS54{Cmd: uint32(CtrlSetTimeslice)}), u64(5)))
	f.Add(EncodeRecord(bpf.NVRMRecordExit, 1, 1, -1, 0, nil, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var ev trace.Event
		if err := Decode(b, &ev); err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || de.Field == "" {
				t.Fatalf("error without a field: %v", err)
			}
			return
		}
		if !ev.Kind.Valid() {
			t.Fatalf("decoded kind %v", ev.Kind)
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	recs := [][]byte{
		EncodeRecord(bpf.NVRMRecordAlloc, 1, 1, 3, EscRMAlloc, block(NVOS64{HClass: 0xA06C}), tsgParams(1)),
		EncodeRecord(bpf.NVRMRecordControl, 1, 1, 3, EscRMControl, block(NVOS54{Cmd: uint32(CtrlSetTimeslice)}), u64(5)),
		EncodeRecord(bpf.NVRMRecordFree, 1, 1, 3, EscRMFree, block(NVOS00{}), nil),
	}
	var ev trace.Event
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := Decode(recs[i%len(recs)], &ev); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mrecords/s")
}

// TestRecordLayout keeps the decoder's offsets in step with struct
// nvrm_record as compiled (bpf2go's -type generates the Go struct from the
// object's BTF).
func TestRecordLayout(t *testing.T) {
	var r bpf.NvrmNvrmRecord
	tests := []struct {
		name      string
		got, want uintptr
	}{
		{"size", unsafe.Sizeof(r), RecordSize},
		{"time_ns", unsafe.Offsetof(r.TimeNs), recTime},
		{"cgroup", unsafe.Offsetof(r.Cgroup), recCgroup},
		{"pid", unsafe.Offsetof(r.Pid), recPID},
		{"tid", unsafe.Offsetof(r.Tid), recTID},
		{"fd", unsafe.Offsetof(r.Fd), recFD},
		{"ret", unsafe.Offsetof(r.Ret), recRet},
		{"kind", unsafe.Offsetof(r.Kind), recKind},
		{"xfer", unsafe.Offsetof(r.Xfer), recXfer},
		{"esc", unsafe.Offsetof(r.Esc), recEsc},
		{"size field", unsafe.Offsetof(r.Size), recSize},
		{"params_len", unsafe.Offsetof(r.ParamsLen), recParamsLen},
		{"block", unsafe.Offsetof(r.Block), recBlock},
		{"params", unsafe.Offsetof(r.Params), recParams},
		{"block length", unsafe.Sizeof(r.Block), blockMax},
		{"params length", unsafe.Sizeof(r.Params), paramsMax},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("nvrm_record %s: %d in the compiled struct, %d in the decoder", tc.name, tc.got, tc.want)
		}
	}
}
