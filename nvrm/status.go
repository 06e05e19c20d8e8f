package nvrm

import (
	"errors"
	"fmt"
)

// Status is an RM NV_STATUS code, the status field of a parameter block
// after the driver ran the call (nvstatuscodes.h).
type Status uint32

// Status codes Arbiter names.
const (
	StatusOK                      Status = 0x0
	StatusBusyRetry               Status = 0x3
	StatusGPUIsLost               Status = 0xF
	StatusInUse                   Status = 0x17
	StatusInsufficientPermissions Status = 0x1B
	StatusInvalidArgument         Status = 0x1F
	StatusInvalidClass            Status = 0x22
	StatusInvalidClient           Status = 0x23
	StatusInvalidCommand          Status = 0x24
	StatusInvalidDevice           Status = 0x26
	StatusInvalidLockState        Status = 0x2F
	StatusInvalidObject           Status = 0x31
	StatusInvalidObjectHandle     Status = 0x33
	StatusInvalidOperation        Status = 0x38
	StatusInvalidParamStruct      Status = 0x3A
	StatusInvalidParameter        Status = 0x3B
	StatusInvalidPointer          Status = 0x3D
	StatusInvalidState            Status = 0x40
	StatusNoMemory                Status = 0x51
	StatusNotSupported            Status = 0x56
	StatusObjectNotFound          Status = 0x57
	StatusTimeout                 Status = 0x65
	StatusResourceLost            Status = 0x6E
	StatusGeneric                 Status = 0xFFFF
)

// Sentinel errors, one per named status: errors.Is(err, ErrInvalidClient)
// holds for a *StatusError carrying StatusInvalidClient.
var (
	ErrBusyRetry               = errors.New("NV_ERR_BUSY_RETRY")
	ErrGPUIsLost               = errors.New("NV_ERR_GPU_IS_LOST")
	ErrInUse                   = errors.New("NV_ERR_IN_USE")
	ErrInsufficientPermissions = errors.New("NV_ERR_INSUFFICIENT_PERMISSIONS")
	ErrInvalidArgument         = errors.New("NV_ERR_INVALID_ARGUMENT")
	ErrInvalidClass            = errors.New("NV_ERR_INVALID_CLASS")
	ErrInvalidClient           = errors.New("NV_ERR_INVALID_CLIENT")
	ErrInvalidCommand          = errors.New("NV_ERR_INVALID_COMMAND")
	ErrInvalidDevice           = errors.New("NV_ERR_INVALID_DEVICE")
	ErrInvalidLockState        = errors.New("NV_ERR_INVALID_LOCK_STATE")
	ErrInvalidObject           = errors.New("NV_ERR_INVALID_OBJECT")
	ErrInvalidObjectHandle     = errors.New("NV_ERR_INVALID_OBJECT_HANDLE")
	ErrInvalidOperation        = errors.New("NV_ERR_INVALID_OPERATION")
	ErrInvalidParamStruct      = errors.New("NV_ERR_INVALID_PARAM_STRUCT")
	ErrInvalidParameter        = errors.New("NV_ERR_INVALID_PARAMETER")
	ErrInvalidPointer          = errors.New("NV_ERR_INVALID_POINTER")
	ErrInvalidState            = errors.New("NV_ERR_INVALID_STATE")
	ErrNoMemory                = errors.New("NV_ERR_NO_MEMORY")
	ErrNotSupported            = errors.New("NV_ERR_NOT_SUPPORTED")
	ErrObjectNotFound          = errors.New("NV_ERR_OBJECT_NOT_FOUND")
	ErrTimeout                 = errors.New("NV_ERR_TIMEOUT")
	ErrResourceLost            = errors.New("NV_ERR_RESOURCE_LOST")
	ErrGeneric                 = errors.New("NV_ERR_GENERIC")
	// ErrUnknownStatus matches any status this package does not name.
	ErrUnknownStatus = errors.New("unknown NV_STATUS")
)

// statusErrors maps each named status to its sentinel. It is only read.
var statusErrors = map[Status]error{
	StatusBusyRetry:               ErrBusyRetry,
	StatusGPUIsLost:               ErrGPUIsLost,
	StatusInUse:                   ErrInUse,
	StatusInsufficientPermissions: ErrInsufficientPermissions,
	StatusInvalidArgument:         ErrInvalidArgument,
	StatusInvalidClass:            ErrInvalidClass,
	StatusInvalidClient:           ErrInvalidClient,
	StatusInvalidCommand:          ErrInvalidCommand,
	StatusInvalidDevice:           ErrInvalidDevice,
	StatusInvalidLockState:        ErrInvalidLockState,
	StatusInvalidObject:           ErrInvalidObject,
	StatusInvalidObjectHandle:     ErrInvalidObjectHandle,
	StatusInvalidOperation:        ErrInvalidOperation,
	StatusInvalidParamStruct:      ErrInvalidParamStruct,
	StatusInvalidParameter:        ErrInvalidParameter,
	StatusInvalidPointer:          ErrInvalidPointer,
	StatusInvalidState:            ErrInvalidState,
	StatusNoMemory:                ErrNoMemory,
	StatusNotSupported:            ErrNotSupported,
	StatusObjectNotFound:          ErrObjectNotFound,
	StatusTimeout:                 ErrTimeout,
	StatusResourceLost:            ErrResourceLost,
	StatusGeneric:                 ErrGeneric,
}

// Err returns nil for StatusOK, else a *StatusError for s.
func (s Status) Err() error {
	if s == StatusOK {
		return nil
	}
	return &StatusError{Status: s}
}

// String returns the status's NV_ERR_* name, or its hex value.
func (s Status) String() string {
	if s == StatusOK {
		return "NV_OK"
	}
	if e, ok := statusErrors[s]; ok {
		return e.Error()
	}
	return fmt.Sprintf("NV_STATUS(%#x)", uint32(s))
}

// StatusError is a call RM ran and refused: the status field of its
// parameter block was not NV_OK.
type StatusError struct {
	Status Status
}

// Error returns the status's name and value.
func (e *StatusError) Error() string {
	return fmt.Sprintf("driver returned %s (%#x)", e.Status, uint32(e.Status))
}

// Is makes errors.Is match the status's sentinel, or ErrUnknownStatus.
func (e *StatusError) Is(target error) bool {
	if s, ok := statusErrors[e.Status]; ok {
		return s == target
	}
	return target == ErrUnknownStatus
}
