package trace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// The trace-file format (docs/trace-format.md describes it byte by byte):
//
//	magic "ARBTRACE" | version u16 LE | header block | records... | end marker
//
// Each record is a kind byte (with two "same as previous" flags), a payload
// length and a payload of varints; times are delta-encoded. The end marker
// carries the event count, so a file cut at a record boundary is reported as
// truncated rather than read as a shorter, complete trace.

// FileVersion is the trace-file format version this package writes.
const FileVersion uint16 = 1

// Magic is the first eight bytes of every trace file.
const Magic = "ARBTRACE"

// Limits that bound every length field a reader trusts.
const (
	// MaxHost and MaxComment bound the header strings.
	MaxHost    = 255
	MaxComment = 64 << 10
	// maxHeaderBlock bounds the header block (its fields plus room to grow).
	maxHeaderBlock = 1 << 20
	// maxRecord bounds a record payload; the largest v1 payload (a launch) is 86 bytes.
	maxRecord = 255
)

// Record kind byte: bits 0-5 the Kind, bit 6 "same PID and TID as the
// previous record", bit 7 "same cgroup as the previous record". 0 is the end
// marker.
const (
	flagSamePID    = 0x40
	flagSameCgroup = 0x80
	kindMask       = 0x3f
	endMarker      = 0x00
	// nameRecord is not an event: it names a process whose exec the
	// recording did not see (Writer.WriteName, Reader.Name).
	nameRecord = 0x3f
)

// Header describes a trace file. It may grow fields; old readers skip what
// they do not know.
type Header struct {
	// Version is the format version: FileVersion when writing (0 means
	// FileVersion), the file's version when read.
	Version uint16
	// Created is when the recording started (zero if unknown).
	Created time.Time
	// Host is the machine recorded on (at most MaxHost bytes).
	Host string
	// Comment is free text, e.g. the command line (at most MaxComment bytes).
	Comment string
}

// FormatError reports a truncated or corrupt trace file.
type FormatError struct {
	// Offset is the byte offset in the file where the problem is.
	Offset int64
	// Msg says what is wrong there.
	Msg string
}

// Error returns "trace file: byte offset N: msg".
func (e *FormatError) Error() string {
	return fmt.Sprintf("trace file: byte offset %d: %s", e.Offset, e.Msg)
}

// ErrWriterClosed is returned by Write after Close.
var ErrWriterClosed = errors.New("trace writer closed")

// Writer streams events into a trace file. It is not safe for concurrent use.
type Writer struct {
	bw     *bufio.Writer
	prev   Event
	count  uint64
	closed bool
	buf    [maxRecord + 2*binary.MaxVarintLen64]byte
	head   [1 + binary.MaxVarintLen64]byte
}

// NewWriter writes h as the file header and returns a Writer for the events.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if h.Version != 0 && h.Version != FileVersion {
		return nil, fmt.Errorf("trace writer: version %d unsupported, this build writes %d", h.Version, FileVersion)
	}
	if len(h.Host) > MaxHost {
		return nil, fmt.Errorf("trace writer: host name is %d bytes, at most %d", len(h.Host), MaxHost)
	}
	if len(h.Comment) > MaxComment {
		return nil, fmt.Errorf("trace writer: comment is %d bytes, at most %d", len(h.Comment), MaxComment)
	}
	var created int64
	if !h.Created.IsZero() {
		created = h.Created.UnixNano()
	}
	block := binary.AppendVarint(nil, created)
	block = binary.AppendUvarint(block, uint64(len(h.Host)))
	block = append(block, h.Host...)
	block = binary.AppendUvarint(block, uint64(len(h.Comment)))
	block = append(block, h.Comment...)

	tw := &Writer{bw: bufio.NewWriterSize(w, 64<<10)}
	hdr := append([]byte(Magic), byte(FileVersion), byte(FileVersion>>8))
	hdr = binary.AppendUvarint(hdr, uint64(len(block)))
	hdr = append(hdr, block...)
	if _, err := tw.bw.Write(hdr); err != nil {
		return nil, fmt.Errorf("trace writer: header: %w", err)
	}
	return tw, nil
}

// Write appends ev. Only the sub-struct that matches ev.Kind is recorded.
func (w *Writer) Write(ev *Event) error {
	if w.closed {
		return ErrWriterClosed
	}
	if !ev.Kind.Valid() {
		return fmt.Errorf("trace writer: event %d: invalid kind %d", w.count, ev.Kind)
	}
	if ev.Func != FuncNone && !ev.Func.Valid() {
		return fmt.Errorf("trace writer: event %d: invalid func %d", w.count, ev.Func)
	}
	kind := byte(ev.Kind)
	p := w.buf[:0]
	p = append(p, byte(ev.Func))
	if ev.PID == w.prev.PID && ev.TID == w.prev.TID {
		kind |= flagSamePID
	} else {
		p = binary.AppendUvarint(p, uint64(ev.PID))
		p = binary.AppendUvarint(p, uint64(ev.TID^ev.PID))
	}
	if ev.Cgroup == w.prev.Cgroup {
		kind |= flagSameCgroup
	} else {
		p = binary.AppendUvarint(p, ev.Cgroup)
	}
	p = binary.AppendVarint(p, int64(ev.Time-w.prev.Time))
	switch ev.Kind {
	case KindLaunch:
		l := &ev.Launch
		p = binary.AppendUvarint(p, l.Function)
		p = binary.AppendUvarint(p, l.Stream)
		for _, d := range l.Grid {
			p = binary.AppendUvarint(p, uint64(d))
		}
		for _, d := range l.Block {
			p = binary.AppendUvarint(p, uint64(d))
		}
		p = binary.AppendUvarint(p, uint64(l.SharedMem))
	case KindCopy:
		c := &ev.Copy
		if c.Dir > CopyDtoH {
			return fmt.Errorf("trace writer: event %d: invalid copy direction %d", w.count, c.Dir)
		}
		p = append(p, byte(c.Dir))
		p = binary.AppendUvarint(p, c.Bytes)
		p = binary.AppendUvarint(p, c.Device)
		p = binary.AppendUvarint(p, c.Host)
		p = binary.AppendUvarint(p, c.Stream)
	case KindSync:
		s := &ev.Sync
		p = binary.AppendUvarint(p, s.Handle)
		p = binary.AppendUvarint(p, s.Other)
		p = binary.AppendUvarint(p, s.Duration)
		p = binary.AppendVarint(p, int64(s.Result))
	case KindExec, KindExit:
		pr := &ev.Proc
		p = binary.AppendUvarint(p, uint64(pr.PPID))
		n := len(pr.Comm)
		for n > 0 && pr.Comm[n-1] == 0 {
			n--
		}
		p = append(p, byte(n))
		p = append(p, pr.Comm[:n]...)
		p = binary.AppendVarint(p, int64(pr.ExitCode))
	case KindRMAlloc, KindRMFree, KindRMControl:
		r := &ev.RM
		p = binary.AppendVarint(p, int64(r.FD))
		for _, v := range [...]uint32{r.Status, r.Client, r.Parent, r.Object, r.Class, r.EngineType, r.Cmd} {
			p = binary.AppendUvarint(p, uint64(v))
		}
		p = binary.AppendUvarint(p, r.Value)
	}
	head := w.head[:]
	head[0] = kind
	n := 1 + binary.PutUvarint(head[1:], uint64(len(p)))
	if _, err := w.bw.Write(head[:n]); err != nil {
		return fmt.Errorf("trace writer: event %d: %w", w.count, err)
	}
	if _, err := w.bw.Write(p); err != nil {
		return fmt.Errorf("trace writer: event %d: %w", w.count, err)
	}
	w.prev = *ev
	w.count++
	return nil
}

// WriteName records the name of process pid, for a process whose exec
// event the recording does not hold (it was running before the recording
// started), so that readers can show and filter it by name. It is not an
// event: Read skips it and Reader.Name returns it. comm is cut to the
// kernel's 15 bytes.
func (w *Writer) WriteName(pid uint32, comm string) error {
	if w.closed {
		return ErrWriterClosed
	}
	if len(comm) > 15 {
		comm = comm[:15]
	}
	p := binary.AppendUvarint(w.buf[:0], uint64(pid))
	p = binary.AppendUvarint(p, uint64(len(comm)))
	p = append(p, comm...)
	head := w.head[:]
	head[0] = nameRecord
	n := 1 + binary.PutUvarint(head[1:], uint64(len(p)))
	if _, err := w.bw.Write(head[:n]); err != nil {
		return fmt.Errorf("trace writer: name of pid %d: %w", pid, err)
	}
	if _, err := w.bw.Write(p); err != nil {
		return fmt.Errorf("trace writer: name of pid %d: %w", pid, err)
	}
	return nil
}

// Count returns the number of events written.
func (w *Writer) Count() uint64 { return w.count }

// Flush writes buffered events to the underlying writer (without the end
// marker), so a reader of a live recording sees them.
func (w *Writer) Flush() error {
	if w.closed {
		return ErrWriterClosed
	}
	if err := w.bw.Flush(); err != nil {
		return fmt.Errorf("trace writer: flush: %w", err)
	}
	return nil
}

// Close writes the end marker and flushes. It does not close the underlying
// writer. A second Close returns nil.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	end := binary.AppendUvarint([]byte{endMarker}, w.count)
	if _, err := w.bw.Write(end); err != nil {
		return fmt.Errorf("trace writer: end marker: %w", err)
	}
	if err := w.bw.Flush(); err != nil {
		return fmt.Errorf("trace writer: flush: %w", err)
	}
	return nil
}

// Reader streams events out of a trace file. Read decodes into the caller's
// Event without allocating. It is not safe for concurrent use.
type Reader struct {
	br    *bufio.Reader
	hdr   Header
	off   int64 // bytes consumed so far
	prev  Event
	count uint64
	err   error // sticky: io.EOF or a *FormatError
	names map[uint32]string
	buf   [maxRecord]byte
}

// NewReader reads and checks the file header.
func NewReader(r io.Reader) (*Reader, error) {
	tr := &Reader{br: bufio.NewReaderSize(r, 64<<10)}
	var fixed [len(Magic) + 2]byte
	if _, err := tr.br.Peek(1); err == io.EOF {
		return nil, &FormatError{Offset: 0, Msg: "empty: no trace file header, no events (a recording is at least its header)"}
	}
	if err := tr.readFull(fixed[:], "file header", KindInvalid); err != nil {
		return nil, err
	}
	if string(fixed[:len(Magic)]) != Magic {
		return nil, &FormatError{Offset: 0, Msg: fmt.Sprintf("not a trace file: magic %q, want %q", fixed[:len(Magic)], Magic)}
	}
	tr.hdr.Version = binary.LittleEndian.Uint16(fixed[len(Magic):])
	if tr.hdr.Version != FileVersion {
		return nil, &FormatError{Offset: int64(len(Magic)),
			Msg: fmt.Sprintf("format version %d unsupported, this build reads %d", tr.hdr.Version, FileVersion)}
	}
	blockOff := tr.off
	size, err := tr.readUvarint("header block length")
	if err != nil {
		return nil, err
	}
	if size > maxHeaderBlock {
		return nil, &FormatError{Offset: blockOff, Msg: fmt.Sprintf("header block length %d exceeds %d", size, maxHeaderBlock)}
	}
	start := tr.off
	block := make([]byte, size)
	if err := tr.readFull(block, "header block", KindInvalid); err != nil {
		return nil, err
	}
	d := decoder{b: block, base: start}
	created := d.varint("header created time")
	host := d.bytes("header host", MaxHost)
	comment := d.bytes("header comment", MaxComment)
	if d.err != nil {
		return nil, d.err
	}
	if created != 0 {
		tr.hdr.Created = time.Unix(0, created)
	}
	tr.hdr.Host, tr.hdr.Comment = string(host), string(comment)
	return tr, nil
}

// Header returns the file header.
func (r *Reader) Header() Header { return r.hdr }

// Name returns the name recorded for pid by Writer.WriteName in the part of
// the file read so far.
func (r *Reader) Name(pid uint32) (string, bool) {
	n, ok := r.names[pid]
	return n, ok
}

// Offset returns the number of bytes consumed so far.
func (r *Reader) Offset() int64 { return r.off }

// Read decodes the next event into ev. It returns io.EOF after the end
// marker of a complete file, and a *FormatError for a truncated or corrupt
// one. After an error every later call returns the same error.
func (r *Reader) Read(ev *Event) error {
	if r.err != nil {
		return r.err
	}
	for {
		isEvent, err := r.read(ev)
		if err != nil {
			r.err = err
			return err
		}
		if isEvent {
			return nil
		}
	}
}

// read decodes the next record: an event into ev (true), or a name record
// (false).
func (r *Reader) read(ev *Event) (bool, error) {
	recOff := r.off
	kind, err := r.br.ReadByte()
	if err != nil {
		if err == io.EOF {
			return false, &FormatError{Offset: recOff, Msg: fmt.Sprintf(
				"file ends after %d events without the end marker (truncated, or the writer was not closed)", r.count)}
		}
		return false, fmt.Errorf("trace file: byte offset %d: %w", recOff, err)
	}
	r.off++
	if kind == endMarker {
		return false, r.readEnd(recOff)
	}
	if kind == nameRecord {
		return false, r.readName(recOff)
	}
	k := Kind(kind & kindMask)
	if !k.Valid() {
		return false, &FormatError{Offset: recOff, Msg: fmt.Sprintf("record kind byte %#02x: unknown kind %d", kind, k)}
	}
	lenOff := r.off
	size, err := r.readUvarint("record length")
	if err != nil {
		return false, err
	}
	if size == 0 || size > maxRecord {
		return false, &FormatError{Offset: lenOff, Msg: fmt.Sprintf("%s record length %d outside 1..%d", k, size, maxRecord)}
	}
	payOff := r.off
	if err := r.readFull(r.buf[:size], "record", k); err != nil {
		return false, err
	}
	d := decoder{b: r.buf[:size], base: payOff}
	*ev = Event{Kind: k}
	f := Func(d.byte("func"))
	if f != FuncNone && !f.Valid() {
		return false, &FormatError{Offset: payOff, Msg: fmt.Sprintf("%s record: unknown func %d", k, f)}
	}
	ev.Func = f
	if kind&flagSamePID != 0 {
		ev.PID, ev.TID = r.prev.PID, r.prev.TID
	} else {
		ev.PID = d.u32("pid")
		ev.TID = d.u32("tid") ^ ev.PID
	}
	if kind&flagSameCgroup != 0 {
		ev.Cgroup = r.prev.Cgroup
	} else {
		ev.Cgroup = d.uvarint("cgroup")
	}
	ev.Time = r.prev.Time + uint64(d.varint("time delta"))
	switch k {
	case KindLaunch:
		l := &ev.Launch
		l.Function = d.uvarint("launch function")
		l.Stream = d.uvarint("launch stream")
		for i := range l.Grid {
			l.Grid[i] = d.u32("launch grid")
		}
		for i := range l.Block {
			l.Block[i] = d.u32("launch block")
		}
		l.SharedMem = d.u32("launch shared memory")
	case KindCopy:
		c := &ev.Copy
		dirOff := d.offset()
		c.Dir = CopyDir(d.byte("copy direction"))
		if d.err == nil && c.Dir > CopyDtoH {
			return false, &FormatError{Offset: dirOff, Msg: fmt.Sprintf("copy record: unknown direction %d", c.Dir)}
		}
		c.Bytes = d.uvarint("copy bytes")
		c.Device = d.uvarint("copy device pointer")
		c.Host = d.uvarint("copy host pointer")
		c.Stream = d.uvarint("copy stream")
	case KindSync:
		s := &ev.Sync
		s.Handle = d.uvarint("sync handle")
		s.Other = d.uvarint("sync other handle")
		s.Duration = d.uvarint("sync duration")
		s.Result = d.i32("sync result")
	case KindExec, KindExit:
		p := &ev.Proc
		p.PPID = d.u32("ppid")
		copy(p.Comm[:], d.bytes("comm", len(p.Comm)))
		p.ExitCode = d.i32("exit code")
	case KindRMAlloc, KindRMFree, KindRMControl:
		m := &ev.RM
		m.FD = d.i32("rm fd")
		m.Status = d.u32("rm status")
		m.Client = d.u32("rm client")
		m.Parent = d.u32("rm parent")
		m.Object = d.u32("rm object")
		m.Class = d.u32("rm class")
		m.EngineType = d.u32("rm engine type")
		m.Cmd = d.u32("rm cmd")
		m.Value = d.uvarint("rm value")
	}
	if d.err != nil {
		return false, d.err
	}
	if len(d.b) != 0 {
		return false, &FormatError{Offset: d.offset(), Msg: fmt.Sprintf(
			"%s record: %d bytes left over after its fields (length %d)", k, len(d.b), size)}
	}
	r.prev = *ev
	r.count++
	return true, nil
}

// readName reads a process-name record (after its kind byte).
func (r *Reader) readName(recOff int64) error {
	lenOff := r.off
	size, err := r.readUvarint("name record length")
	if err != nil {
		return err
	}
	if size == 0 || size > maxRecord {
		return &FormatError{Offset: lenOff, Msg: fmt.Sprintf("name record length %d outside 1..%d", size, maxRecord)}
	}
	payOff := r.off
	if err := r.readFull(r.buf[:size], "name record", KindInvalid); err != nil {
		return err
	}
	d := decoder{b: r.buf[:size], base: payOff}
	pid := d.u32("name record pid")
	comm := d.bytes("name record comm", 15)
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return &FormatError{Offset: d.offset(), Msg: fmt.Sprintf("name record at %d: %d bytes left over after its fields", recOff, len(d.b))}
	}
	if r.names == nil {
		r.names = map[uint32]string{}
	}
	r.names[pid] = string(comm)
	return nil
}

// readEnd checks the end marker's event count and that nothing follows it.
func (r *Reader) readEnd(recOff int64) error {
	countOff := r.off
	n, err := r.readUvarint("end marker event count")
	if err != nil {
		return err
	}
	if n != r.count {
		return &FormatError{Offset: countOff, Msg: fmt.Sprintf("end marker counts %d events, file holds %d", n, r.count)}
	}
	if _, err := r.br.ReadByte(); err != io.EOF {
		if err != nil {
			return fmt.Errorf("trace file: byte offset %d: %w", r.off, err)
		}
		return &FormatError{Offset: r.off, Msg: fmt.Sprintf("data after the end marker at offset %d", recOff)}
	}
	return io.EOF
}

// readFull fills p or reports where the file was cut. A valid kind is
// named in the message (it is passed apart so that the message is built
// only on error: Read must not allocate).
func (r *Reader) readFull(p []byte, what string, kind Kind) error {
	n, err := io.ReadFull(r.br, p)
	start := r.off
	r.off += int64(n)
	if err == nil {
		return nil
	}
	if kind.Valid() {
		what = kind.String() + " " + what
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return &FormatError{Offset: start, Msg: fmt.Sprintf("truncated %s: want %d bytes, file ends after %d (%s)", what, len(p), n, r.cutShort())}
	}
	return fmt.Errorf("trace file: byte offset %d: %s: %w", start, what, err)
}

// cutShort says what a file that ends inside a record means.
func (r *Reader) cutShort() string {
	return fmt.Sprintf("the file was cut short: its writer stopped before closing it, or it was copied while being written; the %d events before were read", r.count)
}

// readUvarint reads a varint from the stream, byte by byte.
func (r *Reader) readUvarint(what string) (uint64, error) {
	start := r.off
	var v uint64
	for i := 0; i < binary.MaxVarintLen64; i++ {
		c, err := r.br.ReadByte()
		if err != nil {
			if err == io.EOF {
				return 0, &FormatError{Offset: start, Msg: "truncated " + what + " (" + r.cutShort() + ")"}
			}
			return 0, fmt.Errorf("trace file: byte offset %d: %s: %w", start, what, err)
		}
		r.off++
		if i == binary.MaxVarintLen64-1 && c > 1 {
			break
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, nil
		}
	}
	return 0, &FormatError{Offset: start, Msg: what + ": varint overflows 64 bits"}
}

// decoder parses fields out of an in-memory record. The first error sticks;
// later fields then decode as zero.
type decoder struct {
	b    []byte
	base int64 // file offset of b[0] as first given
	used int64
	err  *FormatError
}

func (d *decoder) offset() int64 { return d.base + d.used }

func (d *decoder) fail(what, msg string) {
	if d.err == nil {
		d.err = &FormatError{Offset: d.offset(), Msg: what + ": " + msg}
	}
	d.b = nil
}

func (d *decoder) advance(n int) {
	d.b = d.b[n:]
	d.used += int64(n)
}

func (d *decoder) byte(what string) byte {
	if len(d.b) < 1 {
		d.fail(what, "record ends before this field")
		return 0
	}
	c := d.b[0]
	d.advance(1)
	return c
}

func (d *decoder) uvarint(what string) uint64 {
	v, n := binary.Uvarint(d.b)
	switch {
	case n == 0:
		d.fail(what, "record ends inside this field")
		return 0
	case n < 0:
		d.fail(what, "varint overflows 64 bits")
		return 0
	}
	d.advance(n)
	return v
}

func (d *decoder) varint(what string) int64 {
	v, n := binary.Varint(d.b)
	switch {
	case n == 0:
		d.fail(what, "record ends inside this field")
		return 0
	case n < 0:
		d.fail(what, "varint overflows 64 bits")
		return 0
	}
	d.advance(n)
	return v
}

func (d *decoder) u32(what string) uint32 {
	start := d.used
	v := d.uvarint(what)
	if v > math.MaxUint32 {
		d.used = start
		d.fail(what, fmt.Sprintf("value %d exceeds 32 bits", v))
		return 0
	}
	return uint32(v)
}

func (d *decoder) i32(what string) int32 {
	start := d.used
	v := d.varint(what)
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.used = start
		d.fail(what, fmt.Sprintf("value %d exceeds 32 bits", v))
		return 0
	}
	return int32(v)
}

// bytes reads a uvarint length (at most max) and that many bytes.
func (d *decoder) bytes(what string, max int) []byte {
	start := d.used
	n := d.uvarint(what + " length")
	if d.err != nil {
		return nil
	}
	if n > uint64(max) {
		d.used = start
		d.fail(what, fmt.Sprintf("length %d exceeds %d", n, max))
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail(what, fmt.Sprintf("want %d bytes, %d left", n, len(d.b)))
		return nil
	}
	p := d.b[:n]
	d.advance(int(n))
	return p
}
