package nvrm

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Where the loaded driver states its version.
const (
	ProcVersionPath   = "/proc/driver/nvidia/version"
	ModuleVersionPath = "/sys/module/nvidia/version"
)

// ErrUnknownDriver is returned for a driver version whose layouts this
// package has not been checked against: it refuses rather than guesses.
var ErrUnknownDriver = errors.New("unknown driver version")

// ErrNoDriver is returned where no NVIDIA driver is loaded.
var ErrNoDriver = errors.New("no NVIDIA driver loaded")

// Layout holds the parameter layouts that change with the driver version.
type Layout struct {
	// Version is the driver version the layout was chosen for.
	Version DriverVersion
	// ScheduleSize is GPFIFO_SCHEDULE's parameter size: 2 bytes up to
	// 570.x, 3 from 575.
	ScheduleSize uint32
	// ChannelAllocSize is NV_CHANNEL_ALLOC_PARAMS' size (0 where the
	// sources do not say) and ChannelEngineOffset its engineType field.
	// Arbiter takes the engine from the channel group, so these are
	// informational; they let a decoder of channel allocations check the
	// size it was given.
	ChannelAllocSize    uint32
	ChannelEngineOffset uint32
}

// DriverVersion is an NVIDIA driver version, e.g. 570.86.15.
type DriverVersion struct {
	Major, Minor, Patch int
}

// String returns "major.minor[.patch]".
func (v DriverVersion) String() string {
	if v.Patch == 0 {
		return fmt.Sprintf("%d.%02d", v.Major, v.Minor)
	}
	return fmt.Sprintf("%d.%02d.%02d", v.Major, v.Minor, v.Patch)
}

// less reports whether v precedes w.
func (v DriverVersion) less(w DriverVersion) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// Supported driver branches: the layouts below were read from the open
// kernel modules' tags 525 to 610.
const (
	minMajor = 525
	maxMajor = 610
)

var versionRE = regexp.MustCompile(`\b(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?\b`)

// ParseDriverVersion extracts the first version number from text, either
// the bare /sys/module/nvidia/version or the /proc/driver/nvidia/version
// banner ("NVRM version: NVIDIA UNIX ... Kernel Module  570.86.15  ...").
func ParseDriverVersion(text string) (DriverVersion, error) {
	m := versionRE.FindStringSubmatch(text)
	if m == nil {
		return DriverVersion{}, fmt.Errorf("nvrm: no driver version in %q", firstLine(text))
	}
	var v DriverVersion
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Patch, _ = strconv.Atoi(m[3])
	}
	return v, nil
}

// LayoutFor returns the layouts of driver version v, or an error wrapping
// ErrUnknownDriver outside the supported branches.
func LayoutFor(v DriverVersion) (Layout, error) {
	if v.Major < minMajor || v.Major > maxMajor {
		return Layout{}, fmt.Errorf("nvrm: driver %s: %w: channel control is checked against drivers %d to %d only (parameter layouts change between branches)", v, ErrUnknownDriver, minMajor, maxMajor)
	}
	l := Layout{Version: v, ScheduleSize: 2, ChannelEngineOffset: 128}
	if v.Major >= 575 {
		l.ScheduleSize = 3
	}
	switch {
	case v.less(DriverVersion{535, 43, 0}):
		l.ChannelAllocSize = 0 // not stated by the sources
	case v.less(DriverVersion{535, 86, 0}):
		l.ChannelAllocSize = 304
	case v.Major <= 565:
		l.ChannelAllocSize = 360
	case v.Major <= 595:
		l.ChannelAllocSize = 368
	default:
		l.ChannelAllocSize, l.ChannelEngineOffset = 376, 136
	}
	return l, nil
}

// DetectLayout reads the loaded driver's version (ModuleVersionPath, then
// ProcVersionPath, under root, which is "/" outside tests) and returns its
// layouts. It returns an error wrapping ErrNoDriver where neither exists.
func DetectLayout(root string) (Layout, error) {
	var firstErr error
	for _, p := range []string{ModuleVersionPath, ProcVersionPath} {
		b, err := os.ReadFile(root + p)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		v, err := ParseDriverVersion(string(b))
		if err != nil {
			return Layout{}, fmt.Errorf("nvrm: %s: %w", p, err)
		}
		return LayoutFor(v)
	}
	if errors.Is(firstErr, os.ErrNotExist) {
		return Layout{}, fmt.Errorf("nvrm: %w: neither %s nor %s exists (is the nvidia kernel module loaded?)", ErrNoDriver, ModuleVersionPath, ProcVersionPath)
	}
	return Layout{}, fmt.Errorf("nvrm: read driver version: %w", firstErr)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}
