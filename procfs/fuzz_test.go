package procfs

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
)

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("4242 (python3) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2 3\n"))
	f.Add([]byte("42 (a) b) (c) R 7 1"))
	f.Add([]byte("42 (x"))
	f.Add([]byte("42 () S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseStat(b)
		if err != nil {
			return
		}
		// What was parsed is what the line says: the comm lies between
		// the first '(' and the last ')', the rest after it.
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if s.PID <= 0 || s.PPID < 0 || s.State == 0 || s.Comm != string(b[open+1:end]) {
			t.Fatalf("%q -> %+v", b, s)
		}
		fields := bytes.Fields(b[end+1:])
		if len(fields[0]) != 1 || fields[0][0] != s.State || string(fields[1]) != strconv.Itoa(s.PPID) && fields[1][0] != '+' && fields[1][0] != '0' {
			t.Fatalf("%q -> %+v", b, s)
		}
		// The allocation-free start time reader agrees.
		if len(fields) > 19 {
			if v, err := field(b[end+1:], 19, "starttime"); err != nil || v != s.StartTime {
				t.Fatalf("%q: start time %d %v, ParseStat says %d", b, v, err, s.StartTime)
			}
		}
	})
}

func FuzzParseStatus(f *testing.F) {
	f.Add([]byte("Name:\tpython3\nState:\tS (sleeping)\nTgid:\t42\nPPid:\t1\nUid:\t1001\t1001\t1001\t1001\nGid:\t100\t100\t100\t100\nCapEff:\t0000000000000000\n"))
	f.Add([]byte("Uid:"))
	f.Add([]byte("Uid:\t1\t2\t3\t4294967296\n"))
	f.Add([]byte("\n\n:\x00CapEff:\tffffffffffffffff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseStatus(b)
		if err != nil {
			if s != (Status{}) {
				t.Fatalf("%q: error %v with a partial status %+v", b, err, s)
			}
			return
		}
		if s.Tgid < 0 || s.PPID < 0 {
			t.Fatalf("%q -> %+v", b, s)
		}
		if s.Has&HasUID == 0 && s.UID != [4]uint32{} || s.Has&HasGID == 0 && s.GID != [4]uint32{} {
			t.Fatalf("%q: ids without their line: %+v", b, s)
		}
		if s.Has&HasUID != 0 && !bytes.Contains(b, []byte("Uid:")) {
			t.Fatalf("%q: Uid found without a Uid line", b)
		}
	})
}

func FuzzParseMapsLine(f *testing.F) {
	f.Add("7f12a000-7f12b000 r-xp 00001000 fd:01 123456 /usr/lib/libcuda.so.1")
	f.Add("7f12a000-7f12b000 r-xp 00001000 fd:01 1 /a b/libcuda.so.1 (deleted)")
	f.Fuzz(func(t *testing.T, line string) {
		m, ok := ParseMapsLine(line)
		if ok && (!strings.HasPrefix(m.Path, "/") || m.Inode == 0 || m.Start >= m.End || !strings.Contains(line, m.Path)) {
			t.Fatalf("%q parsed as %+v", line, m)
		}
	})
}
