package procfs

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// Mapping is one file mapped by a process: a line of /proc/PID/maps that
// names a file.
type Mapping struct {
	// Start and End are the mapped address range, Offset the file offset
	// it starts at.
	Start, End, Offset uint64
	// Dev and Inode identify the file; Dev is encoded as stat(2)'s st_dev.
	Dev, Inode uint64
	// Path is the file's path in the process's mount namespace; Deleted
	// says it was unlinked or replaced since it was mapped.
	Path    string
	Deleted bool
}

// Maps calls fn with every file mapping of pid, in address order, until
// fn returns false. Anonymous mappings, the heap, stack and vdso are
// skipped. Reading another user's process needs CAP_SYS_PTRACE.
func (f *FS) Maps(pid int, fn func(Mapping) bool) error {
	file, err := os.Open(f.Path(pid, "maps"))
	if err != nil {
		return f.fail(pid, "maps", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		if m, ok := ParseMapsLine(sc.Text()); ok && !fn(m) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return f.fail(pid, "maps", err)
	}
	return nil
}

// MapFile returns the /proc/PID/map_files entry of m: it opens the mapped
// file even when it was deleted. Opening it needs CAP_CHECKPOINT_RESTORE
// (Linux 5.9+) or CAP_SYS_ADMIN.
func (f *FS) MapFile(pid int, m Mapping) string {
	// Named by the range unpadded, where maps pads it to 8 digits.
	return f.Path(pid, "map_files", strconv.FormatUint(m.Start, 16)+"-"+strconv.FormatUint(m.End, 16))
}

// ParseMapsLine parses one /proc/PID/maps line that maps a file:
// "7f..-7f.. r-xp 00000000 fd:01 1234 /usr/lib/libcuda.so.1 (deleted)".
// It returns false for other lines (anonymous memory, [heap], [vdso]) and
// malformed ones.
func ParseMapsLine(line string) (Mapping, bool) {
	var m Mapping
	fields := strings.Fields(line)
	if len(fields) < 6 {
		return m, false
	}
	i := strings.Index(line, fields[5])
	if !strings.HasPrefix(fields[5], "/") || i < 0 {
		return m, false
	}
	m.Path = line[i:]
	if p, ok := strings.CutSuffix(m.Path, " (deleted)"); ok {
		m.Path, m.Deleted = p, true
	}
	maj, min, ok := strings.Cut(fields[3], ":")
	if !ok {
		return m, false
	}
	ma, err1 := strconv.ParseUint(maj, 16, 32)
	mi, err2 := strconv.ParseUint(min, 16, 32)
	ino, err3 := strconv.ParseUint(fields[4], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || ino == 0 {
		return m, false
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	if !ok {
		return m, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	off, err3 := strconv.ParseUint(fields[2], 16, 64)
	if err1 != nil || err2 != nil || err3 != nil || end <= start {
		return m, false
	}
	m.Dev, m.Inode = Mkdev(ma, mi), ino
	m.Start, m.End, m.Offset = start, end, off
	return m, true
}

// Mkdev encodes a device number as the kernel's stat does (glibc's
// makedev), to compare a mapping's device with a file's st_dev.
func Mkdev(major, minor uint64) uint64 {
	return (major&0xfff)<<8 | (major&^0xfff)<<32 | (minor & 0xff) | (minor&^0xff)<<12
}
