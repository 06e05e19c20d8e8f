package nvrm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// The state files' format versions. Every file carries its own "version";
// a build reads each version from oldestStateVersion to stateVersion and
// writes stateVersion. The history:
//
//	1  the registry tree (state.json) and the suspension records
//	   (suspended.json), processes keyed by pid and start time
//	2  adds boot_id, the kernel's boot id when the file was written: the
//	   state directory (/var/lib/arbiter) outlives a reboot, after which a
//	   pid and start time can name a new, unrelated process; the records
//	   of another boot are dropped. A version 1 file has no boot id and is
//	   read as before (pid and start time).
//
// A file of any other version (a newer Arbiter's, after a downgrade) is
// refused without stopping the registry: the tree is not used (its
// processes' handles are forgotten, so they fall back to the launch gate),
// and every suspension record that still decodes is kept, so that it is
// resumed. Each refusal is a *FormatError the caller reports.
const (
	stateVersion       = 2
	oldestStateVersion = 1
)

// FormatError is a state file of a format version this build does not
// read. The registry went on without it, as Instead says.
type FormatError struct {
	// Path is the file.
	Path string
	// Version is the format version it holds.
	Version int
	// Instead says what the registry did with it.
	Instead string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("nvrm: %s has state format version %d, which this arbiter does not read (it reads %s; a newer arbiter wrote it?): %s",
		e.Path, e.Version, readsVersions(), e.Instead)
}

// readsVersions names the versions this build reads: "versions 1 and 2".
func readsVersions() string {
	var vs []string
	for v := oldestStateVersion; v <= stateVersion; v++ {
		vs = append(vs, strconv.Itoa(v))
	}
	if len(vs) == 1 {
		return "version " + vs[0]
	}
	return "versions " + strings.Join(vs[:len(vs)-1], ", ") + " and " + vs[len(vs)-1]
}

// knownVersion reports whether this build reads format version v.
func knownVersion(v int) bool { return v >= oldestStateVersion && v <= stateVersion }

// fileHead is what every format version of a state file starts with.
type fileHead struct {
	Version int    `json:"version"`
	BootID  string `json:"boot_id,omitempty"`
}

// readHead decodes a state file's version and boot id. An error is
// a file that is not a JSON object at all.
func readHead(path string, b []byte) (fileHead, error) {
	var h fileHead
	if err := json.Unmarshal(b, &h); err != nil {
		return h, jsonError(path, err)
	}
	return h, nil
}

// jsonError names the file and, for a syntax error, the byte.
func jsonError(path string, err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("nvrm: %s: byte %d: %w", path, se.Offset, err)
	}
	return fmt.Errorf("nvrm: %s: %w", path, err)
}

// otherBoot reports whether a file of boot id written describes another
// boot than this one (now): only where both are known.
func otherBoot(written, now string) bool {
	return written != "" && now != "" && written != now
}

// bootIDPath is where the kernel publishes its boot id.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// readBootID returns the kernel's boot id, "" where it cannot be read (the
// records are then kept by pid and start time alone, as in version 1).
func readBootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}

// salvageSuspended reads the records of a suspended-groups file of a
// version this build does not read, as far as they decode into this
// build's record (the pid, start time and group handles are what resuming
// needs). It returns the records read and how many could not be.
func salvageSuspended(b []byte) (recs []SuspendedGroup, lost int) {
	var f struct {
		Suspended []json.RawMessage `json:"suspended"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, -1
	}
	for _, raw := range f.Suspended {
		s, ok := salvageRecord(raw)
		if !ok {
			lost++
			continue
		}
		recs = append(recs, s)
	}
	return recs, lost
}

// salvageRecord decodes one suspension record of an unknown version. A
// method this build does not know is replaced by the undo its fields
// allow: a record naming the subdevice that FIFO_DISABLE_CHANNELS went to
// is resumed by re-enabling the channels there, any other by scheduling
// the group again.
func salvageRecord(raw json.RawMessage) (SuspendedGroup, bool) {
	var s SuspendedGroup
	if err := json.Unmarshal(raw, &s); err != nil {
		var fields struct {
			PID       uint32 `json:"pid"`
			StartTime uint64 `json:"start_time"`
			Group     Group  `json:"group"`
			Subdevice uint32 `json:"subdevice"`
		}
		if json.Unmarshal(raw, &fields) != nil {
			return s, false
		}
		s = SuspendedGroup{PID: fields.PID, StartTime: fields.StartTime, Group: fields.Group, Method: SuspendSchedule, Subdevice: fields.Subdevice}
		if fields.Subdevice != 0 {
			s.Method = SuspendDisableChannels
		}
	}
	return s, s.PID != 0 && s.Group.Client != 0 && s.Group.Handle != 0
}

// Refused returns the state files the registry did not read because of
// their format version, in the order met.
func (r *Registry) Refused() []*FormatError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.refused)
}
