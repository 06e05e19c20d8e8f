package nvrm

import "fmt"

// ioctl encoding. The driver reads only the number and the size of a
// request; the size must equal the parameter struct's size exactly.
const (
	// IoctlMagic is the ioctl type byte of every NVIDIA driver request ('F').
	IoctlMagic = 0x46

	iocWrite     = 1
	iocRead      = 2
	iocNrBits    = 8
	iocTypeBits  = 8
	iocSizeBits  = 14
	iocTypeShift = iocNrBits
	iocSizeShift = iocTypeShift + iocTypeBits
	iocDirShift  = iocSizeShift + iocSizeBits
)

// Escape is an RM escape: the number (low byte) of an NVIDIA ioctl request.
type Escape uint8

// RM escapes and driver ioctls.
const (
	EscRMAllocMemory  Escape = 0x27
	EscRMAllocObject  Escape = 0x28
	EscRMFree         Escape = 0x29
	EscRMControl      Escape = 0x2A
	EscRMAlloc        Escape = 0x2B
	EscRMDupObject    Escape = 0x34
	EscRMShare        Escape = 0x35
	EscRMMapMemory    Escape = 0x4E
	EscCardInfo       Escape = 200
	EscRegisterFD     Escape = 201
	EscCheckVersion   Escape = 210
	EscIoctlXferCmd   Escape = 211
	maxDirectIoctlLen        = 1<<iocSizeBits - 1
)

// Request returns the _IOWR request number for escape e with a parameter
// struct of size bytes. The size must fit the request's 14-bit size field;
// larger parameters travel through EscIoctlXferCmd.
func Request(e Escape, size uintptr) (uint32, error) {
	if size > maxDirectIoctlLen {
		return 0, fmt.Errorf("nvrm: request for escape %#x: size %d exceeds the ioctl size field (max %d)", uint8(e), size, maxDirectIoctlLen)
	}
	return uint32((iocRead|iocWrite)<<iocDirShift | size<<iocSizeShift | IoctlMagic<<iocTypeShift | uintptr(e)), nil
}

// iowr is the direction and type bits shared by every request.
const iowr = (iocRead|iocWrite)<<iocDirShift | IoctlMagic<<iocTypeShift

// Full request numbers of the calls Arbiter issues or traces.
const (
	// ReqRMAlloc21 is RM_ALLOC with an NVOS21 block (0xC020462B).
	ReqRMAlloc21 uint32 = iowr | 32<<iocSizeShift | uint32(EscRMAlloc)
	// ReqRMAlloc64 is RM_ALLOC with an NVOS64 block (0xC030462B).
	ReqRMAlloc64 uint32 = iowr | 48<<iocSizeShift | uint32(EscRMAlloc)
	// ReqRMControl is RM_CONTROL with an NVOS54 block (0xC020462A).
	ReqRMControl uint32 = iowr | 32<<iocSizeShift | uint32(EscRMControl)
	// ReqRMFree is RM_FREE with an NVOS00 block (0xC0104629).
	ReqRMFree uint32 = iowr | 16<<iocSizeShift | uint32(EscRMFree)
	// ReqXferCmd is IOCTL_XFER_CMD (0xC01046D3).
	ReqXferCmd uint32 = iowr | 16<<iocSizeShift | uint32(EscIoctlXferCmd)
	// ReqRegisterFD is REGISTER_FD (0xC00446C9).
	ReqRegisterFD uint32 = iowr | 4<<iocSizeShift | uint32(EscRegisterFD)
)

// NVOS00 is RM_FREE's parameter block (nvos.h NVOS00_PARAMETERS).
type NVOS00 struct {
	HRoot         uint32
	HObjectParent uint32
	HObjectOld    uint32
	Status        uint32
}

// NVOS21 is RM_ALLOC's short parameter block (NVOS21_PARAMETERS).
type NVOS21 struct {
	HRoot         uint32
	HObjectParent uint32
	HObjectNew    uint32
	HClass        uint32
	PAllocParms   uint64
	ParamsSize    uint32
	Status        uint32
}

// NVOS64 is RM_ALLOC's parameter block with requested access rights
// (NVOS64_PARAMETERS).
type NVOS64 struct {
	HRoot            uint32
	HObjectParent    uint32
	HObjectNew       uint32
	HClass           uint32
	PAllocParms      uint64
	PRightsRequested uint64
	ParamsSize       uint32
	Flags            uint32
	Status           uint32
	_                uint32
}

// nvos21Pre535 is NVOS21_PARAMETERS before 535.43.02, which had no
// paramsSize: status sits at byte 24, where 535.43.02 put paramsSize, and
// the block is padded to 32 bytes, so the request number is NVOS21's own.
// Kept to state why those drivers are refused (LayoutFor); never issued.
type nvos21Pre535 struct {
	HRoot, HObjectParent, HObjectNew, HClass uint32
	PAllocParms                              uint64
	Status                                   uint32
	_                                        uint32
}

// nvos64Pre535 is NVOS64_PARAMETERS before 535.43.02: 40 bytes, flags at
// byte 32 and status at 36, allocated with reqRMAlloc64Pre535.
type nvos64Pre535 struct {
	HRoot, HObjectParent, HObjectNew, HClass uint32
	PAllocParms, PRightsRequested            uint64
	Flags, Status                            uint32
}

// reqRMAlloc64Pre535 is RM_ALLOC with a pre-535.43.02 NVOS64 block
// (0xC028462B).
const reqRMAlloc64Pre535 uint32 = iowr | 40<<iocSizeShift | uint32(EscRMAlloc)

// NVOS54 is RM_CONTROL's parameter block (NVOS54_PARAMETERS).
type NVOS54 struct {
	HClient    uint32
	HObject    uint32
	Cmd        uint32
	Flags      uint32
	Params     uint64
	ParamsSize uint32
	Status     uint32
}

// XferCmd is IOCTL_XFER_CMD's indirection (nv_ioctl_xfer_t): Cmd is the
// inner escape, Ptr its parameters of Size bytes.
type XferCmd struct {
	Cmd  uint32
	Size uint32
	Ptr  uint64
}

// Class is an RM object class id.
type Class uint32

// Classes Arbiter tracks or allocates.
const (
	ClassRoot          Class = 0x0    // NV01_ROOT
	ClassRootNonPriv   Class = 0x1    // NV01_ROOT_NON_PRIV
	ClassRootClient    Class = 0x41   // NV01_ROOT_CLIENT
	ClassDevice        Class = 0x80   // NV01_DEVICE_0
	ClassSubdevice     Class = 0x2080 // NV20_SUBDEVICE_0
	ClassChannelGroup  Class = 0xA06C // KEPLER_CHANNEL_GROUP_A (TSG)
	ClassContextShare  Class = 0x9067 // FERMI_CONTEXT_SHARE_A
	ClassVASpace       Class = 0x90F1 // FERMI_VASPACE_A
	ClassGraphicsCtx   Class = 0x90   // KERNEL_GRAPHICS_CONTEXT
	ClassHopperGPFIFO  Class = 0xC86F // HOPPER_CHANNEL_GPFIFO_A
	ClassHopperCompute Class = 0xCBC0 // HOPPER_COMPUTE_A
	ClassHopperCopy    Class = 0xC8B5 // HOPPER_DMA_COPY_A
)

// gpfifoClasses are the GPFIFO channel classes, Kepler to Blackwell.
var gpfifoClasses = [...]Class{0xA06F, 0xA16F, 0xB06F, 0xC06F, 0xC36F, 0xC46F, 0xC56F, 0xC86F, 0xC96F, 0xCA6F}

// IsClient reports whether c allocates an RM client (a root object).
func (c Class) IsClient() bool {
	return c == ClassRoot || c == ClassRootNonPriv || c == ClassRootClient
}

// IsChannel reports whether c is a GPFIFO channel class.
func (c Class) IsChannel() bool {
	for _, g := range gpfifoClasses {
		if c == g {
			return true
		}
	}
	return false
}

// String names the class where it is one Arbiter knows, else its hex id.
func (c Class) String() string {
	switch c {
	case ClassRoot, ClassRootNonPriv, ClassRootClient:
		return "client"
	case ClassDevice:
		return "device"
	case ClassSubdevice:
		return "subdevice"
	case ClassChannelGroup:
		return "channel-group"
	case ClassContextShare:
		return "context-share"
	case ClassVASpace:
		return "vaspace"
	}
	if c.IsChannel() {
		return fmt.Sprintf("gpfifo-%04X", uint32(c))
	}
	return fmt.Sprintf("class-%04X", uint32(c))
}

// EngineType is a channel group's RM engine type (NV2080_ENGINE_TYPE_*).
type EngineType uint32

// Engine types of channel groups.
const (
	EngineGraphics EngineType = 0x01 // GR0: the compute channel group
	EngineCopy0    EngineType = 0x09 // COPY0..COPY9 are 0x09..0x12
	EngineNVDEC0   EngineType = 0x13
	EngineCopy10   EngineType = 0x34 // COPY10..COPY19 are 0x34..0x3D
)

// String returns "graphics", "copyN", "nvdec0" or the hex value.
func (e EngineType) String() string {
	switch {
	case e == EngineGraphics:
		return "graphics"
	case e >= EngineCopy0 && e <= EngineCopy0+9:
		return fmt.Sprintf("copy%d", e-EngineCopy0)
	case e >= EngineCopy10 && e <= EngineCopy10+9:
		return fmt.Sprintf("copy%d", e-EngineCopy10+10)
	case e == EngineNVDEC0:
		return "nvdec0"
	case e == 0:
		return "unknown"
	}
	return fmt.Sprintf("engine-%#x", uint32(e))
}

// ChannelGroupAllocParams is NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, the
// allocation parameters of a TSG (stable from 525 to 610).
type ChannelGroupAllocParams struct {
	HObjectError                uint32
	HObjectEccError             uint32
	HVASpace                    uint32
	EngineType                  uint32
	BIsCallingContextVgpuPlugin uint8
	_                           [3]uint8
}

// Offsets inside allocation parameters that the tracer reads.
const (
	// OffTSGEngineType is engineType's offset in ChannelGroupAllocParams.
	OffTSGEngineType = 12
	// OffDeviceID is deviceId's offset in NV0080_ALLOC_PARAMETERS and
	// subDeviceId's in NV2080_ALLOC_PARAMETERS.
	OffDeviceID = 0
)

// Control is an RM control command id (NVOS54.Cmd).
type Control uint32

// Channel-group (KEPLER_CHANNEL_GROUP_A) controls, issued with
// NVOS54.HObject = the TSG, and the subdevice controls of the alternative
// path. GET_INTERLEAVE_LEVEL is in the headers, but no driver's
// KernelChannelGroupApi exports it (tags 525 to 595): the driver answers
// NV_ERR_NOT_SUPPORTED, so Arbiter never issues it and keeps the level it
// set in the registry instead.
const (
	CtrlGPFIFOSchedule        Control = 0xA06C0101
	CtrlSetTimeslice          Control = 0xA06C0103
	CtrlGetTimeslice          Control = 0xA06C0104
	CtrlPreempt               Control = 0xA06C0105
	CtrlGetInfo               Control = 0xA06C0106
	CtrlSetInterleaveLevel    Control = 0xA06C0107
	CtrlGetInterleaveLevel    Control = 0xA06C0108 // not exported: never issued
	CtrlFIFODisableChannels   Control = 0x2080110B
	CtrlRunlistSetSchedPolicy Control = 0x20801115
)

// String names the control.
func (c Control) String() string {
	switch c {
	case CtrlGPFIFOSchedule:
		return "GPFIFO_SCHEDULE"
	case CtrlSetTimeslice:
		return "SET_TIMESLICE"
	case CtrlGetTimeslice:
		return "GET_TIMESLICE"
	case CtrlPreempt:
		return "PREEMPT"
	case CtrlGetInfo:
		return "GET_INFO"
	case CtrlSetInterleaveLevel:
		return "SET_INTERLEAVE_LEVEL"
	case CtrlGetInterleaveLevel:
		return "GET_INTERLEAVE_LEVEL"
	case CtrlFIFODisableChannels:
		return "FIFO_DISABLE_CHANNELS"
	case CtrlRunlistSetSchedPolicy:
		return "RUNLIST_SET_SCHED_POLICY"
	}
	return fmt.Sprintf("control-0x%08x", uint32(c))
}

// ScheduleParams is GPFIFO_SCHEDULE's parameters. The driver takes 2 bytes
// (bEnable, bSkipSubmit) up to 570.x and 3 (adding bSkipEnable) from 575:
// Layout.ScheduleSize says how many to pass.
type ScheduleParams struct {
	BEnable     uint8
	BSkipSubmit uint8
	BSkipEnable uint8
}

// TimesliceParams is SET_TIMESLICE's and GET_TIMESLICE's parameter.
type TimesliceParams struct {
	TimesliceUs uint64
}

// PreemptParams is PREEMPT's parameters. TimeoutUs applies with
// BManualTimeout and may not exceed MaxPreemptTimeoutUs; without
// BManualTimeout the firmware's own default timeout applies.
type PreemptParams struct {
	BWait          uint8
	BManualTimeout uint8
	_              [2]uint8
	TimeoutUs      uint32
}

// MaxPreemptTimeoutUs is the largest timeout PREEMPT accepts.
const MaxPreemptTimeoutUs = 1_000_000

// GetInfoParams is GET_INFO's result: the hardware TSG id.
type GetInfoParams struct {
	TSGID uint32
}

// InterleaveParams is SET_INTERLEAVE_LEVEL's parameter.
type InterleaveParams struct {
	Level uint32
}

// DefaultTimesliceUs is the driver's default channel-group timeslice.
const DefaultTimesliceUs = 1024

// Rdev is a device number in the kernel's encoding (major<<20 | minor), the
// form eBPF reads from an inode.
type Rdev uint32

// MkRdev encodes major:minor the way the kernel does internally.
func MkRdev(major, minor uint32) Rdev { return Rdev(major<<20 | minor&0xfffff) }

// Major and Minor split the number.
func (r Rdev) Major() uint32 { return uint32(r) >> 20 }

// Minor returns the minor number.
func (r Rdev) Minor() uint32 { return uint32(r) & 0xfffff }

// String returns "major:minor".
func (r Rdev) String() string { return fmt.Sprintf("%d:%d", r.Major(), r.Minor()) }

// ControlRdev is /dev/nvidiactl's device number, char 195:255.
const ControlRdev = Rdev(195<<20 | 255)

// ControlPath is the control device's usual path.
const ControlPath = "/dev/nvidiactl"

// FIFODisableChannelsParams is NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS'
// parameters, issued on a subdevice: it disables (and, unless
// BOnlyDisableScheduling, preempts) up to 64 listed channels, each named
// by its client and channel handles, in one call; GSP GPUs only
// (NOT_SUPPORTED elsewhere). Arbiter lists only the target process's own
// client and channels, on its own subdevice, through its own file
// (SuspendDisableChannels).
type FIFODisableChannelsParams struct {
	BDisable               uint8
	_                      [3]uint8
	NumChannels            uint32
	BOnlyDisableScheduling uint8
	BRewindGpPut           uint8
	_                      [6]uint8
	PRunlistPreemptEvent   uint64 // must be 0
	HClientList            [64]uint32
	HChannelList           [64]uint32
}

// RunlistSchedPolicyParams is NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY's
// parameters (SchedPolicy 0: default, 1: CHANNEL_INTERLEAVED).
type RunlistSchedPolicyParams struct {
	Flags       uint32
	SchedPolicy uint32
}
