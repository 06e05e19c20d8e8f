package uprobe

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"unsafe"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestRecordLayout checks the decoder's offsets against the Go struct that
// bpf2go generated from the object's BTF, in both directions (a field that
// moves, grows or shrinks).
func TestRecordLayout(t *testing.T) {
	var e bpf.CudaEvent
	if got := int(unsafe.Sizeof(e)); got != RecordSize {
		t.Fatalf("sizeof(struct event) = %d, decoder expects %d", got, RecordSize)
	}
	for _, c := range []struct {
		name      string
		off, want uintptr
	}{
		{"time", unsafe.Offsetof(e.Time), offTime},
		{"cgroup", unsafe.Offsetof(e.Cgroup), offCgroup},
		{"args", unsafe.Offsetof(e.Args), offArgs},
		{"pid", unsafe.Offsetof(e.Pid), offPID},
		{"tid", unsafe.Offsetof(e.Tid), offTID},
		{"dims", unsafe.Offsetof(e.Dims), offDims},
		{"result", unsafe.Offsetof(e.Result), offResult},
		{"kind", unsafe.Offsetof(e.Kind), offKind},
		{"func", unsafe.Offsetof(e.Func), offFunc},
	} {
		if c.off != c.want {
			t.Errorf("offset of %s = %d, decoder uses %d", c.name, c.off, c.want)
		}
	}
}

// TestKindValues checks the kind numbers hard-coded in bpf/cuda.c.
func TestKindValues(t *testing.T) {
	for k, want := range map[trace.Kind]uint8{trace.KindLaunch: 1, trace.KindCopy: 2, trace.KindSync: 3, trace.KindExec: 4, trace.KindExit: 5} {
		if uint8(k) != want {
			t.Errorf("trace.Kind %v = %d, cuda.c uses %d", k, k, want)
		}
	}
	if bpf.CookieKindShift != 8 {
		t.Errorf("CookieKindShift = %d, cuda.c reads the kind from bits 8-15", bpf.CookieKindShift)
	}
}

// record encodes e as the kernel would.
func record(e bpf.CudaEvent) []byte {
	b, err := binary.Append(nil, binary.LittleEndian, e)
	if err != nil {
		panic(err)
	}
	return b
}

func TestDecode(t *testing.T) {
	comm := [2]uint64{binary.LittleEndian.Uint64([]byte("python3\x00")), 0}
	commBytes := [16]byte{'p', 'y', 't', 'h', 'o', 'n', '3'}
	head := func(kind trace.Kind, fn trace.Func) bpf.CudaEvent {
		return bpf.CudaEvent{Time: 1e9, Cgroup: 77, Pid: 10, Tid: 11, Kind: uint8(kind), Func: uint8(fn)}
	}
	with := func(e bpf.CudaEvent, f func(*bpf.CudaEvent)) bpf.CudaEvent { f(&e); return e }
	base := trace.Event{PID: 10, TID: 11, Time: 1e9, Cgroup: 77}
	ev := func(f func(*trace.Event)) trace.Event { e := base; f(&e); return e }

	tests := []struct {
		name string
		in   bpf.CudaEvent
		want trace.Event
	}{
		{"launch", with(head(trace.KindLaunch, trace.FuncLaunchKernelPtsz), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0xf00, 0x5e, 99, 99}
			e.Dims = [7]uint32{1, 2, 3, 4, 5, 6, 4096}
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindLaunch, trace.FuncLaunchKernelPtsz
			e.Launch = trace.Launch{Function: 0xf00, Stream: 0x5e, Grid: [3]uint32{1, 2, 3}, Block: [3]uint32{4, 5, 6}, SharedMem: 4096}
		})},
		{"graph launch", with(head(trace.KindLaunch, trace.FuncGraphLaunch), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0x6a, 0x5e, 0, 0}
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindLaunch, trace.FuncGraphLaunch
			e.Launch = trace.Launch{Function: 0x6a, Stream: 0x5e}
		})},
		{"htod async", with(head(trace.KindCopy, trace.FuncMemcpyHtoDAsyncV2), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0xd0, 0x40, 1 << 33, 0x5e}
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindCopy, trace.FuncMemcpyHtoDAsyncV2
			e.Copy = trace.Copy{Dir: trace.CopyHtoD, Bytes: 1 << 33, Device: 0xd0, Host: 0x40, Stream: 0x5e}
		})},
		{"dtoh sync ignores the 4th register", with(head(trace.KindCopy, trace.FuncMemcpyDtoHV2), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0x40, 0xd0, 12, 0xdead}
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindCopy, trace.FuncMemcpyDtoHV2
			e.Copy = trace.Copy{Dir: trace.CopyDtoH, Bytes: 12, Device: 0xd0, Host: 0x40}
		})},
		{"v1 copy keeps 32 bits", with(head(trace.KindCopy, trace.FuncMemcpyDtoHAsync), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0x40, 0xffff_0000_0000_d000, 0xffff_0000_0000_0010, 0x5e}
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindCopy, trace.FuncMemcpyDtoHAsync
			e.Copy = trace.Copy{Dir: trace.CopyDtoH, Bytes: 0x10, Device: 0xd000, Host: 0x40, Stream: 0x5e}
		})},
		{"stream sync", with(head(trace.KindSync, trace.FuncStreamSynchronize), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0x5e, 0x77, 1500, 0}
			e.Result = 400
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindSync, trace.FuncStreamSynchronize
			e.Sync = trace.Sync{Handle: 0x5e, Duration: 1500, Result: 400}
		})},
		{"ctx sync has no handles", with(head(trace.KindSync, trace.FuncCtxSynchronize), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0x5e, 0x77, 1500, 0}
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindSync, trace.FuncCtxSynchronize
			e.Sync = trace.Sync{Duration: 1500}
		})},
		{"ctx sync v2 keeps its context", with(head(trace.KindSync, trace.FuncCtxSynchronizeV2), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0xc0, 0x77, 1500, 0}
			e.Result = 201
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindSync, trace.FuncCtxSynchronizeV2
			e.Sync = trace.Sync{Handle: 0xc0, Duration: 1500, Result: 201}
		})},
		{"event record", with(head(trace.KindSync, trace.FuncEventRecordWithFlagsPtsz), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{0xe0, 0x5e, 10, 0}
			e.Result = -1
		}), ev(func(e *trace.Event) {
			e.Kind, e.Func = trace.KindSync, trace.FuncEventRecordWithFlagsPtsz
			e.Sync = trace.Sync{Handle: 0xe0, Other: 0x5e, Duration: 10, Result: -1}
		})},
		{"exec", with(head(trace.KindExec, trace.FuncNone), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{comm[0], comm[1], 0, 0}
			e.Dims[0] = 1
		}), ev(func(e *trace.Event) {
			e.Kind = trace.KindExec
			e.Proc = trace.Proc{PPID: 1, Comm: commBytes}
		})},
		{"exit", with(head(trace.KindExit, trace.FuncNone), func(e *bpf.CudaEvent) {
			e.Args = [4]uint64{comm[0], comm[1], 0, 0}
			e.Result = 256
		}), ev(func(e *trace.Event) {
			e.Kind = trace.KindExit
			e.Proc = trace.Proc{ExitCode: 256, Comm: commBytes}
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A reused event full of old values must come out exactly.
			got := trace.Event{Launch: trace.Launch{Function: 1}, Sync: trace.Sync{Result: 5}, Proc: trace.Proc{PPID: 3}}
			if err := Decode(record(tc.in), &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	good := record(bpf.CudaEvent{Kind: uint8(trace.KindLaunch), Func: uint8(trace.FuncLaunchKernel)})
	mut := func(off int, v byte) []byte { b := append([]byte(nil), good...); b[off] = v; return b }
	tests := []struct {
		name  string
		raw   []byte
		field string
		off   int
	}{
		{"empty", nil, "record", 0},
		{"short", good[:95], "record", 95},
		{"kind 0", mut(offKind, 0), "kind", offKind},
		{"kind 200", mut(offKind, 200), "kind", offKind},
		{"func 0 on launch", mut(offFunc, 0), "func", offFunc},
		{"func 250", mut(offFunc, 250), "func", offFunc},
		{"copy func on launch", mut(offFunc, uint8(trace.FuncMemcpyHtoD)), "kind", offKind},
		{"func on exec", mut(offKind, uint8(trace.KindExec)), "func", offFunc},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ev trace.Event
			err := Decode(tc.raw, &ev)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want *DecodeError", err)
			}
			if de.Field != tc.field || de.Offset != tc.off {
				t.Errorf("error names %s at %d, want %s at %d (%v)", de.Field, de.Offset, tc.field, tc.off, err)
			}
		})
	}
}

func TestDecodeAllocates(t *testing.T) {
	raw := record(bpf.CudaEvent{Kind: uint8(trace.KindCopy), Func: uint8(trace.FuncMemcpyHtoDAsyncV2), Args: [4]uint64{1, 2, 3, 4}})
	var ev trace.Event
	if n := testing.AllocsPerRun(1000, func() { _ = Decode(raw, &ev) }); n != 0 {
		t.Errorf("Decode allocates %.1f times per record", n)
	}
}

func FuzzDecode(f *testing.F) {
	for _, k := range []trace.Kind{trace.KindLaunch, trace.KindCopy, trace.KindSync, trace.KindExec, trace.KindExit} {
		for _, fn := range append(trace.Funcs(), trace.FuncNone) {
			f.Add(record(bpf.CudaEvent{Kind: uint8(k), Func: uint8(fn), Args: [4]uint64{1, 2, 3, 4}, Result: 400}))
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, RecordSize+8))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ev trace.Event
		err := Decode(raw, &ev)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || de.Offset < 0 || de.Offset > RecordSize {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		if !ev.Kind.Valid() {
			t.Fatalf("decoded invalid kind %v", ev.Kind)
		}
		if (ev.Kind == trace.KindLaunch || ev.Kind == trace.KindCopy || ev.Kind == trace.KindSync) != ev.Func.Valid() {
			t.Fatalf("kind %v with func %v", ev.Kind, ev.Func)
		}
		if ev.Func.Valid() && ev.Func.Info().Kind != ev.Kind {
			t.Fatalf("func %v decoded as %v", ev.Func, ev.Kind)
		}
		// Decoding is deterministic and ignores bytes past the record.
		var again trace.Event
		if err := Decode(append(append([]byte(nil), raw...), 0xff), &again); err != nil || again != ev {
			t.Fatalf("trailing byte changed the result: %v %+v", err, again)
		}
	})
}
