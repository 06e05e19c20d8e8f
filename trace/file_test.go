package trace

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// sampleEvents returns one event for every Func (with its kind) and one of
// every non-call kind, with fields that exercise varint edges.
func sampleEvents() []Event {
	var evs []Event
	t := uint64(1_000_000_000)
	for i, f := range Funcs() {
		info := f.Info()
		ev := Event{Kind: info.Kind, Func: f, PID: 4242, TID: 4242 + uint32(i%3), Time: t, Cgroup: 7 + uint64(i%2)}
		t += uint64(i) * 1500
		switch info.Kind {
		case KindLaunch:
			ev.Launch = Launch{Function: 0x5555_dead_beef + uint64(i), Stream: 0x7f00_0000_1000,
				Grid: [3]uint32{uint32(i) + 1, 2, math.MaxUint32}, Block: [3]uint32{256, 1, 1}, SharedMem: 49152}
		case KindCopy:
			ev.Copy = Copy{Dir: info.Dir, Bytes: 1 << uint(i), Device: 0x302000000, Host: 0x7ffd_1234_5678, Stream: uint64(i)}
		case KindSync:
			ev.Sync = Sync{Handle: 0x55aa_0000 + uint64(i), Other: uint64(i), Duration: 123456, Result: int32(i%2) * 400}
		}
		evs = append(evs, ev)
	}
	// Time going backwards (events reported at return can be out of order).
	evs = append(evs, Event{Kind: KindSync, Func: FuncCtxSynchronize, PID: 1, TID: 2, Time: 999, Cgroup: math.MaxUint64,
		Sync: Sync{Duration: math.MaxUint64, Result: math.MinInt32}})
	exec := Event{Kind: KindExec, PID: math.MaxUint32, TID: math.MaxUint32, Time: math.MaxUint64, Proc: Proc{PPID: 1}}
	copy(exec.Proc.Comm[:], "python3")
	exit := Event{Kind: KindExit, PID: 77, TID: 0, Time: 5, Proc: Proc{PPID: 0, ExitCode: -9}}
	copy(exit.Proc.Comm[:], "0123456789abcdef")
	evs = append(evs, exec, exit)
	for k := KindRMAlloc; k <= KindRMControl; k++ {
		evs = append(evs, Event{Kind: k, PID: 77, TID: 78, Time: 10 + uint64(k), RM: RM{FD: -1, Status: 0x1f,
			Client: 0xc1d00001, Parent: 0xcaf00000, Object: 0xcaf00042, Class: 0xa06c, EngineType: 1,
			Cmd: 0xa06c0103, Value: math.MaxUint64}})
	}
	return evs
}

func encode(t testing.TB, h Header, evs []Event) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		if err := w.Write(&evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readAll returns the events of data and the error that ended reading
// (nil for a clean io.EOF).
func readAll(data []byte) (Header, []Event, error) {
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return Header{}, nil, err
	}
	var evs []Event
	for {
		var ev Event
		err := r.Read(&ev)
		if err == io.EOF {
			return r.Header(), evs, nil
		}
		if err != nil {
			return r.Header(), evs, err
		}
		evs = append(evs, ev)
	}
}

func TestRoundTripEveryKindAndFunc(t *testing.T) {
	evs := sampleEvents()
	kinds := map[Kind]bool{}
	for _, ev := range evs {
		kinds[ev.Kind] = true
	}
	if len(kinds) != int(kindCount)-1 {
		t.Fatalf("sample covers %d kinds, want %d", len(kinds), kindCount-1)
	}
	h := Header{Created: time.Unix(1700000000, 123456789), Host: "gpu-node-7", Comment: "arbiter trace --record x"}
	data := encode(t, h, evs)
	got, back, err := readAll(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != FileVersion || !got.Created.Equal(h.Created) || got.Host != h.Host || got.Comment != h.Comment {
		t.Errorf("header = %+v, want %+v", got, h)
	}
	if len(back) != len(evs) {
		t.Fatalf("read %d events, wrote %d", len(back), len(evs))
	}
	for i := range evs {
		if back[i] != evs[i] {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, back[i], evs[i])
		}
	}
	t.Logf("%d events in %d bytes", len(evs), len(data))
}

func TestRoundTripDropsOtherSubStructs(t *testing.T) {
	ev := Event{Kind: KindLaunch, Func: FuncLaunchKernel, PID: 1, Launch: Launch{Function: 9},
		Copy: Copy{Bytes: 5}, Sync: Sync{Duration: 3}}
	_, back, err := readAll(encode(t, Header{}, []Event{ev}))
	if err != nil {
		t.Fatal(err)
	}
	want := Event{Kind: KindLaunch, Func: FuncLaunchKernel, PID: 1, Launch: Launch{Function: 9}}
	if len(back) != 1 || back[0] != want {
		t.Errorf("got %+v, want %+v", back, want)
	}
}

func TestEmptyFile(t *testing.T) {
	data := encode(t, Header{}, nil)
	h, evs, err := readAll(data)
	if err != nil || len(evs) != 0 {
		t.Fatalf("empty file: %v, %d events", err, len(evs))
	}
	if !h.Created.IsZero() || h.Host != "" || h.Comment != "" || h.Version != 1 {
		t.Errorf("header %+v", h)
	}
}

// goldenEvents is a small file whose bytes are fixed by the format.
func goldenEvents() []Event {
	exec := Event{Kind: KindExec, PID: 100, TID: 100, Time: 1000, Cgroup: 5, Proc: Proc{PPID: 1}}
	copy(exec.Proc.Comm[:], "infer")
	return []Event{
		exec,
		{Kind: KindCopy, Func: FuncMemcpyHtoDAsyncV2, PID: 100, TID: 100, Time: 1100, Cgroup: 5,
			Copy: Copy{Dir: CopyHtoD, Bytes: 4096, Device: 0x10, Host: 0x20, Stream: 3}},
		{Kind: KindLaunch, Func: FuncLaunchKernel, PID: 100, TID: 101, Time: 1150, Cgroup: 5,
			Launch: Launch{Function: 0x40, Stream: 3, Grid: [3]uint32{64, 1, 1}, Block: [3]uint32{256, 1, 1}}},
		{Kind: KindSync, Func: FuncStreamSynchronize, PID: 100, TID: 100, Time: 1140, Cgroup: 5,
			Sync: Sync{Handle: 3, Duration: 500}},
	}
}

const goldenHex = "" +
	"4152425452414345" + "0100" + // magic, version 1
	"0a" + "00" + "04" + "686f7374" + "03" + "616263" + // header block: 10 bytes; created 0, "host", "abc"
	// exec: kind 4, 14 bytes: func 0, pid 100, tid^pid 0, cgroup 5, Δt 1000 (zigzag d00f), ppid 1, "infer", exit 0
	"04" + "0e" + "00" + "64" + "00" + "05" + "d00f" + "01" + "05" + "696e666572" + "00" +
	// copy, same pid/tid and cgroup (0xc0|2), 9 bytes: func 13, Δt 100, htod, 4096, dev 0x10, host 0x20, stream 3
	"c2" + "09" + "0d" + "c801" + "01" + "8020" + "10" + "20" + "03" +
	// launch, same cgroup (0x80|1), 14 bytes: func 1, pid 100, tid^pid 1, Δt 50, fn 0x40, stream 3, grid, block, shared 0
	"81" + "0e" + "01" + "64" + "01" + "64" + "40" + "03" + "400101" + "800201" + "01" + "00" +
	// sync, same cgroup (0x80|3), 9 bytes: func 21, pid 100, tid^pid 0, Δt -10 (zigzag 13), stream 3, other 0, 500 ns, result 0
	"83" + "09" + "15" + "64" + "00" + "13" + "03" + "00" + "f403" + "00" +
	"00" + "04" // end marker, 4 events

func TestGoldenBytes(t *testing.T) {
	data := encode(t, Header{Host: "host", Comment: "abc"}, goldenEvents())
	got := hex.EncodeToString(data)
	if got != goldenHex {
		t.Errorf("encoding changed:\n got %s\nwant %s", got, goldenHex)
	}
	want, err := hex.DecodeString(goldenHex)
	if err != nil {
		t.Fatal(err)
	}
	_, evs, err := readAll(want)
	if err != nil {
		t.Fatal(err)
	}
	g := goldenEvents()
	if len(evs) != len(g) {
		t.Fatalf("golden file: %d events, want %d", len(evs), len(g))
	}
	for i := range g {
		if evs[i] != g[i] {
			t.Errorf("golden event %d: got %+v, want %+v", i, evs[i], g[i])
		}
	}
}

func TestTruncationAtEveryOffset(t *testing.T) {
	data := encode(t, Header{Host: "h", Comment: "c"}, goldenEvents())
	for n := 0; n < len(data); n++ {
		_, evs, err := readAll(data[:n])
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Errorf("cut at %d of %d: err = %v (%d events), want a *FormatError", n, len(data), err, len(evs))
			continue
		}
		if fe.Offset < 0 || fe.Offset > int64(n) {
			t.Errorf("cut at %d: error offset %d outside the file", n, fe.Offset)
		}
		if !strings.Contains(err.Error(), "byte offset") {
			t.Errorf("cut at %d: error %q does not name the offset", n, err)
		}
	}
}

func TestCorruptFiles(t *testing.T) {
	good := encode(t, Header{Host: "host", Comment: "abc"}, goldenEvents())
	patch := func(off int, b ...byte) []byte {
		d := bytes.Clone(good)
		copy(d[off:], b)
		return d
	}
	// Offsets into the golden file: header block at 10, first record at 21.
	const rec0 = 21
	tests := []struct {
		name   string
		data   []byte
		offset int64
		msg    string
	}{
		{"bad magic", patch(0, 'X'), 0, "not a trace file"},
		{"future version", patch(8, 2), 8, "format version 2 unsupported"},
		{"empty", nil, 0, "empty: no trace file header, no events"},
		{"huge header block", patch(10, 0xff, 0xff, 0xff, 0x7f), 10, "header block length 268435455 exceeds"},
		{"host too long", append(append([]byte(Magic), 1, 0, 3, 0, 0x80, 0x02), make([]byte, 10)...), 12, "header host: length 256 exceeds 255"},
		{"unknown kind", patch(rec0, 0x3e), rec0, "unknown kind 62"},
		{"unknown kind with flags", patch(rec0, 0xff), rec0, "unknown kind 63"},
		{"name record comm too long", patch(rec0, 0x3f, 0x05, 0x01, 0x10), rec0 + 3, "name record comm: length 16 exceeds 15"},
		{"zero length", patch(rec0+1, 0), rec0 + 1, "record length 0"},
		{"length too long", patch(rec0+1, 0x80, 0x02), rec0 + 1, "record length 256 outside 1..255"},
		{"unknown func", patch(rec0+2, 200), rec0 + 2, "unknown func 200"},
		{"comm too long", patch(rec0+9, 17), rec0 + 9, "comm: length 17 exceeds 16"},
		{"pid over 32 bits", patch(rec0+3, 0xff, 0xff, 0xff, 0xff, 0x7f), rec0 + 3, "pid: value 34359738367 exceeds 32 bits"},
		{"bad copy dir", patch(rec0+21, 7), rec0 + 21, "unknown direction 7"},
		{"wrong end count", patch(len(good)-1, 9), int64(len(good) - 1), "end marker counts 9 events, file holds 4"},
		{"data after end", append(bytes.Clone(good), 0), int64(len(good)), "data after the end marker"},
		{"leftover bytes", patch(rec0+1, 0x0f), rec0 + 16, "exec record: 1 bytes left over"},
		{"short record", patch(rec0+1, 0x0d), rec0 + 15, "exit code: record ends inside this field"},
		{"truncated payload", good[:rec0+5], rec0 + 2, "truncated exec record: want 14 bytes, file ends after 3 (the file was cut short: its writer stopped before closing it, or it was copied while being written; the 0 events before were read)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := readAll(tt.data)
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want *FormatError", err)
			}
			if fe.Offset != tt.offset || !strings.Contains(fe.Msg, tt.msg) {
				t.Errorf("got offset %d %q, want offset %d containing %q", fe.Offset, fe.Msg, tt.offset, tt.msg)
			}
		})
	}
}

func TestNameRecords(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{})
	if err != nil {
		t.Fatal(err)
	}
	evs := goldenEvents()
	if err := w.WriteName(7, "train"); err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		if err := w.Write(&evs[i]); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if err := w.WriteName(100, "a-very-long-process-name"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Name(7); ok {
		t.Error("name known before its record was read")
	}
	var ev Event
	var n int
	for ; ; n++ {
		err := r.Read(&ev)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev != evs[n] {
			t.Errorf("event %d: got %+v, want %+v", n, ev, evs[n])
		}
		if name, ok := r.Name(7); !ok || name != "train" {
			t.Errorf("after event %d: Name(7) = %q, %v", n, name, ok)
		}
	}
	if n != len(evs) {
		t.Errorf("read %d events, want %d (name records are not events)", n, len(evs))
	}
	if name, _ := r.Name(100); name != "a-very-long-pr"+"o" {
		t.Errorf("Name(100) = %q, want the kernel's 15 bytes", name)
	}
	if err := w.WriteName(1, "x"); !errors.Is(err, ErrWriterClosed) {
		t.Errorf("WriteName after Close = %v", err)
	}
}

func TestReaderErrorIsSticky(t *testing.T) {
	data := encode(t, Header{}, goldenEvents())
	r, err := NewReader(bytes.NewReader(data[:len(data)-2]))
	if err != nil {
		t.Fatal(err)
	}
	var ev Event
	var first error
	for first == nil {
		first = r.Read(&ev)
	}
	if again := r.Read(&ev); again != first {
		t.Errorf("second Read = %v, want the same %v", again, first)
	}
}

func TestWriterRejects(t *testing.T) {
	if _, err := NewWriter(io.Discard, Header{Version: 9}); err == nil {
		t.Error("version 9 accepted")
	}
	if _, err := NewWriter(io.Discard, Header{Host: strings.Repeat("h", MaxHost+1)}); err == nil {
		t.Error("long host accepted")
	}
	if _, err := NewWriter(io.Discard, Header{Comment: strings.Repeat("c", MaxComment+1)}); err == nil {
		t.Error("long comment accepted")
	}
	w, err := NewWriter(io.Discard, Header{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []Event{{Kind: KindInvalid}, {Kind: 99}, {Kind: KindLaunch, Func: 250},
		{Kind: KindCopy, Copy: Copy{Dir: 3}}} {
		if err := w.Write(&ev); err == nil {
			t.Errorf("event %+v accepted", ev)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := w.Write(&Event{Kind: KindLaunch}); !errors.Is(err, ErrWriterClosed) {
		t.Errorf("Write after Close = %v", err)
	}
}

func TestReadDoesNotAllocate(t *testing.T) {
	evs := sampleEvents()
	var many []Event
	for len(many) < 1000 {
		many = append(many, evs...)
	}
	data := encode(t, Header{}, many)
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var ev Event
	allocs := testing.AllocsPerRun(500, func() {
		if err := r.Read(&ev); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Read allocates %.1f times per event", allocs)
	}
}

func FuzzReader(f *testing.F) {
	f.Add(encode(f, Header{Host: "h", Comment: "c"}, goldenEvents()))
	f.Add(encode(f, Header{Created: time.Unix(1, 2)}, sampleEvents()))
	f.Add(encode(f, Header{}, nil))
	f.Add([]byte(Magic))
	var named bytes.Buffer
	if w, err := NewWriter(&named, Header{}); err == nil {
		w.WriteName(42, "python3")
		evs := goldenEvents()
		w.Write(&evs[1])
		w.Close()
	}
	f.Add(named.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Offset < 0 || fe.Offset > int64(len(data)) {
				t.Fatalf("NewReader: %v", err)
			}
			return
		}
		var evs []Event
		for i := 0; ; i++ {
			if i > len(data) {
				t.Fatalf("more events than bytes: reader does not advance")
			}
			var ev Event
			err := r.Read(&ev)
			if err == io.EOF {
				break
			}
			if err != nil {
				var fe *FormatError
				if !errors.As(err, &fe) || fe.Offset < 0 || fe.Offset > int64(len(data)) {
					t.Fatalf("Read: %v (offset outside 0..%d)", err, len(data))
				}
				return
			}
			evs = append(evs, ev)
		}
		// A file that reads cleanly re-encodes to events that read back the same.
		again := encode(t, r.Header(), evs)
		_, back, err := readAll(again)
		if err != nil || len(back) != len(evs) {
			t.Fatalf("re-encode: %v, %d of %d events", err, len(back), len(evs))
		}
		for i := range evs {
			if back[i] != evs[i] {
				t.Fatalf("re-encoded event %d differs: %+v vs %+v", i, back[i], evs[i])
			}
		}
	})
}

// benchEvents is a realistic mix: one inference request after another.
func benchEvents(n int) []Event {
	evs := make([]Event, 0, n)
	t := uint64(1 << 40)
	for len(evs) < n {
		evs = append(evs, Event{Kind: KindCopy, Func: FuncMemcpyHtoDAsyncV2, PID: 4000, TID: 4000, Time: t, Cgroup: 9001,
			Copy: Copy{Dir: CopyHtoD, Bytes: 1 << 20, Device: 0x302000000, Host: 0x7f12_3456_0000, Stream: 0x55d0_0000_1230}})
		for i := 0; i < 8; i++ {
			t += 3_000
			evs = append(evs, Event{Kind: KindLaunch, Func: FuncLaunchKernel, PID: 4000, TID: 4000, Time: t, Cgroup: 9001,
				Launch: Launch{Function: 0x55d0_0000_2000 + uint64(i), Stream: 0x55d0_0000_1230,
					Grid: [3]uint32{64, 1, 1}, Block: [3]uint32{256, 1, 1}}})
		}
		t += 2_000
		evs = append(evs, Event{Kind: KindSync, Func: FuncStreamSynchronize, PID: 4000, TID: 4000, Time: t, Cgroup: 9001,
			Sync: Sync{Handle: 0x55d0_0000_1230, Duration: 900_000}})
		t += 5_000_000
	}
	return evs[:n]
}

func BenchmarkWriter(b *testing.B) {
	evs := benchEvents(10_000)
	var buf bytes.Buffer
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		buf.Reset()
		w, err := NewWriter(&buf, Header{})
		if err != nil {
			b.Fatal(err)
		}
		for j := range evs {
			if err := w.Write(&evs[j]); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(buf.Len())/float64(len(evs)), "bytes/event")
}

func BenchmarkReader(b *testing.B) {
	evs := benchEvents(10_000)
	data := encode(b, Header{}, evs)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	var ev Event
	for i := 0; i < b.N; i++ {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		for {
			err := r.Read(&ev)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(len(data))/float64(len(evs)), "bytes/event")
}
