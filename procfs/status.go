package procfs

import (
	"bytes"
	"strconv"
)

// Status is what Arbiter reads of /proc/PID/status. A line the file lacks
// leaves its field zero (Has says which ids were there); a line that is
// there but malformed is an error.
type Status struct {
	// Name is the command name, escaped by the kernel (a newline is
	// written \n).
	Name  string
	State byte
	Tgid  int
	PPID  int
	// UID and GID are the real, effective, saved and filesystem ids.
	UID, GID [4]uint32
	// CapEff is the effective capability set.
	CapEff uint64
	// Has says which of UID, GID and CapEff the file had.
	Has StatusFields
}

// StatusFields is a set of Status fields.
type StatusFields uint8

// Status fields that may be absent.
const (
	HasUID StatusFields = 1 << iota
	HasGID
	HasCapEff
)

// Status reads /proc/PID/status.
func (f *FS) Status(pid int) (Status, error) {
	var buf [4096]byte
	b, err := f.read(pid, "status", buf[:0], 64<<10)
	if err != nil {
		return Status{}, err
	}
	s, err := ParseStatus(b)
	if err != nil {
		return Status{}, f.fail(pid, "status", err)
	}
	return s, nil
}

// UID reads pid's real and effective user ids from /proc/PID/status.
func (f *FS) UID(pid int) (real, effective uint32, err error) {
	s, err := f.Status(pid)
	if err != nil {
		return 0, 0, err
	}
	if s.Has&HasUID == 0 {
		return 0, 0, f.fail(pid, "status", &ParseError{"status", "no Uid line"})
	}
	return s.UID[0], s.UID[1], nil
}

// ParseStatus parses /proc/PID/status.
func ParseStatus(b []byte) (Status, error) {
	var s Status
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		key, val, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		val = bytes.TrimSpace(val)
		var err error
		switch string(key) {
		case "Name":
			s.Name = string(val)
		case "State":
			if len(val) == 0 {
				return Status{}, &ParseError{"status State", "empty"}
			}
			s.State = val[0]
		case "Tgid":
			s.Tgid, err = statusPID("Tgid", val)
		case "PPid":
			s.PPID, err = statusPID("PPid", val)
		case "Uid":
			s.UID, err = statusIDs("Uid", val)
			s.Has |= HasUID
		case "Gid":
			s.GID, err = statusIDs("Gid", val)
			s.Has |= HasGID
		case "CapEff":
			s.CapEff, err = strconv.ParseUint(string(val), 16, 64)
			if err != nil {
				err = &ParseError{"status CapEff", strconv.Quote(string(val)) + " is not a hexadecimal capability set"}
			}
			s.Has |= HasCapEff
		}
		if err != nil {
			return Status{}, err
		}
	}
	return s, nil
}

func statusPID(key string, val []byte) (int, error) {
	v, err := strconv.Atoi(string(val))
	if err != nil || v < 0 {
		return 0, &ParseError{"status " + key, strconv.Quote(string(val)) + " is not a process id"}
	}
	return v, nil
}

// statusIDs parses "real effective saved filesystem".
func statusIDs(key string, val []byte) ([4]uint32, error) {
	var ids [4]uint32
	f := bytes.Fields(val)
	if len(f) != 4 {
		return ids, &ParseError{"status " + key, strconv.Quote(string(val)) + ": want 4 ids (real, effective, saved, filesystem)"}
	}
	for i, x := range f {
		v, err := strconv.ParseUint(string(x), 10, 32)
		if err != nil {
			return ids, &ParseError{"status " + key, strconv.Quote(string(x)) + " is not an id"}
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}
