package nvrm

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"unsafe"
)

// Where the loaded driver states its version.
const (
	ProcVersionPath   = "/proc/driver/nvidia/version"
	ModuleVersionPath = "/sys/module/nvidia/version"
)

// ErrUnsupportedDriver is returned for a driver older than MinDriver():
// its parameter layouts are known, and differ from those this package
// decodes and issues.
var ErrUnsupportedDriver = errors.New("driver not supported")

// ErrUnverifiedDriver is returned for a driver newer than
// NewestVerifiedDriver(), whose layouts nobody has checked, unless
// LayoutOptions.AllowUnverified accepts the risk.
var ErrUnverifiedDriver = errors.New("driver version not verified")

// ErrNoDriver is returned where no NVIDIA driver is loaded.
var ErrNoDriver = errors.New("no NVIDIA driver loaded")

// Layout holds the parameter layouts that change with the driver version.
type Layout struct {
	// Version is the driver version the layout was chosen for.
	Version DriverVersion
	// Unverified is set where Version is newer than NewestVerifiedDriver()
	// and LayoutOptions.AllowUnverified accepted it: the layouts are those
	// of the newest verified branch, assumed unchanged.
	Unverified bool
	// ScheduleSize is GPFIFO_SCHEDULE's parameter size: 2 bytes up to
	// 570.x, 3 from 575.
	ScheduleSize uint32
	// ChannelAllocSize is NV_CHANNEL_ALLOC_PARAMS' size and
	// ChannelEngineOffset its engineType field.
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

// The driver versions whose layouts were checked, from the open kernel
// modules' tags 525.47.04 to 595.45.04. Only read.
var (
	minDriver            = DriverVersion{535, 43, 2}
	newestVerifiedDriver = DriverVersion{595, 45, 4}
)

// MinDriver returns the oldest driver whose layouts this package decodes
// and issues, 535.43.02: the first tag whose RM_ALLOC blocks carry
// paramsSize. The 525 and 530 branches before it lay NVOS21 and NVOS64 out
// differently (nvos21Pre535, nvos64Pre535) and are end-of-life.
func MinDriver() DriverVersion { return minDriver }

// NewestVerifiedDriver returns the newest driver whose sources the layouts
// were checked against, 595.45.04. Later versions, of the 595 branch or
// newer, are unverified: see ErrUnverifiedDriver.
func NewestVerifiedDriver() DriverVersion { return newestVerifiedDriver }

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

// LayoutOptions says which driver versions LayoutFor and DetectLayout
// accept; nil means the defaults.
type LayoutOptions struct {
	// AllowUnverified accepts a driver newer than NewestVerifiedDriver(),
	// with the layouts of the newest verified branch: an operator's
	// explicit choice (arbiter channels --allow-unverified-driver). A
	// layout that changed would make controls fail with
	// NV_ERR_INVALID_ARGUMENT or, worse, act on misread fields.
	AllowUnverified bool
}

// LayoutFor returns the layouts of driver version v. It returns an error
// wrapping ErrUnsupportedDriver for a driver older than MinDriver(), and
// one wrapping ErrUnverifiedDriver for one newer than
// NewestVerifiedDriver() unless opts allows it. The tracer decodes allocations with the same
// layouts: gate it with LayoutFor (or DetectLayout) too.
func LayoutFor(v DriverVersion, opts *LayoutOptions) (Layout, error) {
	if v.less(minDriver) {
		return Layout{}, fmt.Errorf("nvrm: driver %s: %w: Arbiter needs %s or later. %s; the %d and %d branches are end-of-life: upgrade the driver",
			v, ErrUnsupportedDriver, minDriver, pre535Layouts(), 525, 530)
	}
	l := Layout{Version: v, ScheduleSize: 2, ChannelEngineOffset: 128}
	if newestVerifiedDriver.less(v) {
		if opts == nil || !opts.AllowUnverified {
			return Layout{}, fmt.Errorf("nvrm: driver %s: %w: the newest driver checked is %s (the %d branch); refusing channel control rather than guessing its parameter layouts: use a driver up to %s, or accept the risk explicitly (LayoutOptions.AllowUnverified)",
				v, ErrUnverifiedDriver, newestVerifiedDriver, newestVerifiedDriver.Major, newestVerifiedDriver)
		}
		l.Unverified = true
		v = newestVerifiedDriver // its layouts, assumed unchanged
	}
	if v.Major >= 575 {
		l.ScheduleSize = 3
	}
	switch {
	case v.less(DriverVersion{535, 86, 0}):
		l.ChannelAllocSize = 304
	case v.Major <= 565:
		l.ChannelAllocSize = 360
	default:
		l.ChannelAllocSize = 368
	}
	return l, nil
}

// DetectLayout reads the loaded driver's version (ModuleVersionPath, then
// ProcVersionPath, under root, which is "/" outside tests) and returns its
// layouts, as LayoutFor. It returns an error wrapping ErrNoDriver where
// neither file exists.
func DetectLayout(root string, opts *LayoutOptions) (Layout, error) {
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
		return LayoutFor(v, opts)
	}
	if errors.Is(firstErr, os.ErrNotExist) {
		return Layout{}, fmt.Errorf("nvrm: %w: neither %s nor %s exists (is the nvidia kernel module loaded?)", ErrNoDriver, ModuleVersionPath, ProcVersionPath)
	}
	return Layout{}, fmt.Errorf("nvrm: read driver version: %w", firstErr)
}

// pre535Layouts says how the blocks of drivers before 535.43.02 differ,
// from the structs above.
func pre535Layouts() string {
	return fmt.Sprintf("Before %s RM_ALLOC's blocks had no paramsSize: NVOS21's status is at byte %d (not %d) and NVOS64 is %d bytes with its status at byte %d (not %d and %d; request %#x), so allocations would be dropped or their status read from padding",
		minDriver, unsafe.Offsetof(nvos21Pre535{}.Status), unsafe.Offsetof(NVOS21{}.Status),
		unsafe.Sizeof(nvos64Pre535{}), unsafe.Offsetof(nvos64Pre535{}.Status), unsafe.Sizeof(NVOS64{}), unsafe.Offsetof(NVOS64{}.Status), reqRMAlloc64Pre535)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}
