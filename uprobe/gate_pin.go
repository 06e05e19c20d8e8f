package uprobe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// GateFormat is the format version of the gate map this build pins. The
// version is in the pin's name: version 1 is GateMapName (launch_gate), a
// later version N pins launch_gate_vN beside it, so that builds of two
// formats never load each other's map as their own. Every format keeps the
// key (the process's thread-group id, 4 bytes) and the start of the value
// (start time in ns, u64; stopped flag, u32), so that any build can
// release a gate of any format: a daemon or `arbiter recover` of an older
// build, after a downgrade, still continues what a newer one stopped.
//
// The stop records (StopsMapName) are pinned beside the gate of this
// format and read only with it; a gate pinned without them (by an earlier
// build) opens without them.
const GateFormat = 1

// GatePin is a launch gate pinned in a directory, of any format.
type GatePin struct {
	// Path is the pin.
	Path string
	// Format is its format version, read from its name.
	Format int
}

// gatePinName is the pin name of a gate of format version v.
func gatePinName(v int) string {
	if v == 1 {
		return GateMapName
	}
	return GateMapName + "_v" + strconv.Itoa(v)
}

// FindGates returns the launch gates pinned in dir (empty:
// DefaultGatePinDir), of every format version, this build's first; none
// where dir does not exist.
func FindGates(dir string) ([]GatePin, error) {
	if dir == "" {
		dir = DefaultGatePinDir
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the launch gates pinned in %s: %w", dir, err)
	}
	var out []GatePin
	for _, e := range ents {
		v := 0
		switch name := e.Name(); {
		case name == GateMapName:
			v = 1
		case strings.HasPrefix(name, GateMapName+"_v"):
			n, err := strconv.Atoi(strings.TrimPrefix(name, GateMapName+"_v"))
			if err != nil || n < 2 || gatePinName(n) != name {
				continue // not a gate's name
			}
			v = n
		default:
			continue
		}
		out = append(out, GatePin{Path: filepath.Join(dir, e.Name()), Format: v})
	}
	slices.SortFunc(out, func(a, b GatePin) int {
		if (a.Format == GateFormat) != (b.Format == GateFormat) {
			if a.Format == GateFormat {
				return -1
			}
			return 1
		}
		return a.Format - b.Format
	})
	return out, nil
}

// OpenGatePin opens a pinned gate of any format without a tracer, as
// OpenGate does: its entries can be listed, released and the pin removed.
// A gate of another format than GateFormat opens where its map keeps the
// layout every format shares; otherwise the error says what the map is.
// A gate of this format opens with the stop records pinned beside it; it
// opens without them where they cannot be read, and then ReleaseAll
// reports why and Unpin refuses. Records pinned without their gate (an
// older build removed the gate's pin alone) open with an empty gate in
// its place. It returns an error wrapping ErrNoGate where nothing is
// pinned at p.Path, nor records beside it.
func OpenGatePin(p GatePin) (*Gate, error) {
	m, err := ebpf.LoadPinnedMap(p.Path, nil)
	if errors.Is(err, os.ErrNotExist) && p.Format == GateFormat {
		if m, err = standInGate(p.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", p.Path, ErrNoGate)
	}
	if err != nil {
		return nil, fmt.Errorf("open the pinned launch gate %s (needs CAP_BPF, or root): %w", p.Path, err)
	}
	if p.Format == GateFormat {
		if want := bpfGateEntrySize(); m.Type() != ebpf.Hash || m.KeySize() != 4 || m.ValueSize() != want {
			m.Close()
			return nil, fmt.Errorf("open the pinned launch gate %s: a %v map with %d-byte keys and %d-byte values, want a hash of 4-byte keys and %d-byte values for format version %d (written by another build of Arbiter? remove the pin once no process is stopped)",
				p.Path, m.Type(), m.KeySize(), m.ValueSize(), want, GateFormat)
		}
	} else if m.Type() != ebpf.Hash || m.KeySize() != 4 || m.ValueSize() < gatePrefixSize {
		m.Close()
		return nil, fmt.Errorf("open the pinned launch gate %s (format version %d): a %v map with %d-byte keys and %d-byte values, not the hash of 4-byte process ids with values of at least %d bytes every gate format keeps: this build cannot release it; run `arbiter recover` of the version that pinned it",
			p.Path, p.Format, m.Type(), m.KeySize(), m.ValueSize(), gatePrefixSize)
	}
	g := &Gate{entries: m, procRoot: DefaultProcRoot, owned: true, held: map[uint32]struct{}{}}
	if p.Format == GateFormat {
		g.stops, g.stopsErr = openStops(stopsPath(p.Path))
	}
	return g, nil
}

// stopsPath is where the stop records of the gate pinned at gate are.
func stopsPath(gate string) string { return filepath.Join(filepath.Dir(gate), StopsMapName) }

// standInGate returns an empty, unpinned gate map of this format where
// stop records are pinned beside gate (a gate's path, pinned nowhere),
// so that they can be released; an error wrapping os.ErrNotExist where
// none are.
func standInGate(gate string) (*ebpf.Map, error) {
	if _, err := os.Stat(stopsPath(gate)); errors.Is(err, os.ErrNotExist) {
		return nil, err
	} else if err != nil {
		return nil, fmt.Errorf("look for the launch gate's pinned stop records: %w", err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "gate_stand_in", Type: ebpf.Hash, KeySize: 4, ValueSize: bpfGateEntrySize(), MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("release the stop records pinned at %s without their gate (needs CAP_BPF, or root): %w", stopsPath(gate), err)
	}
	return m, nil
}

// openStops opens the gate's stop records pinned at path (see Gate): nil
// where none are pinned there, as a build that pinned the gate alone
// left it.
func openStops(path string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the launch gate's pinned stop records %s (needs CAP_BPF, or root): %w", path, err)
	}
	if m.Type() != ebpf.Hash || m.KeySize() != 4 || m.ValueSize() != 8 {
		m.Close()
		return nil, fmt.Errorf("open the launch gate's pinned stop records %s: a %v map with %d-byte keys and %d-byte values, want a hash of 4-byte process ids and 8-byte start times (written by another build of Arbiter? remove the pin once no process is stopped)",
			path, m.Type(), m.KeySize(), m.ValueSize())
	}
	return m, nil
}
