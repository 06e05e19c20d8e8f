package nvrm

import (
	"errors"
	"fmt"
	"testing"
)

func TestStatusErrors(t *testing.T) {
	tests := []struct {
		s    Status
		want error
		name string
	}{
		{StatusInvalidClient, ErrInvalidClient, "NV_ERR_INVALID_CLIENT"},
		{StatusNotSupported, ErrNotSupported, "NV_ERR_NOT_SUPPORTED"},
		{StatusInvalidArgument, ErrInvalidArgument, "NV_ERR_INVALID_ARGUMENT"},
		{StatusObjectNotFound, ErrObjectNotFound, "NV_ERR_OBJECT_NOT_FOUND"},
		{StatusInsufficientPermissions, ErrInsufficientPermissions, "NV_ERR_INSUFFICIENT_PERMISSIONS"},
		{StatusTimeout, ErrTimeout, "NV_ERR_TIMEOUT"},
		{StatusInvalidState, ErrInvalidState, "NV_ERR_INVALID_STATE"},
		{StatusGeneric, ErrGeneric, "NV_ERR_GENERIC"},
		// nvstatuscodes.h: 0x2E is INVALID_LIMIT, 0x2F INVALID_LOCK_STATE,
		// 0x3B INVALID_PARAMETER, 0x3C INVALID_PATH, 0x3D INVALID_POINTER.
		{0x2F, ErrInvalidLockState, "NV_ERR_INVALID_LOCK_STATE"},
		{0x3B, ErrInvalidParameter, "NV_ERR_INVALID_PARAMETER"},
		{0x3D, ErrInvalidPointer, "NV_ERR_INVALID_POINTER"},
		{0x2E, ErrUnknownStatus, "NV_STATUS(0x2e)"},
		{Status(0x1234), ErrUnknownStatus, "NV_STATUS(0x1234)"},
	}
	for _, tc := range tests {
		err := fmt.Errorf("SET_TIMESLICE: %w", tc.s.Err())
		if !errors.Is(err, tc.want) {
			t.Errorf("%#x: errors.Is(%v, %v) false", uint32(tc.s), err, tc.want)
		}
		if tc.want != ErrInvalidClient && errors.Is(err, ErrInvalidClient) {
			t.Errorf("%#x matches ErrInvalidClient", uint32(tc.s))
		}
		if tc.s.String() != tc.name {
			t.Errorf("%#x: name %q, want %q", uint32(tc.s), tc.s.String(), tc.name)
		}
		var se *StatusError
		if !errors.As(err, &se) || se.Status != tc.s {
			t.Errorf("%#x: errors.As gives %v", uint32(tc.s), se)
		}
	}
	if StatusOK.Err() != nil || StatusOK.String() != "NV_OK" {
		t.Error("NV_OK is not nil")
	}
	if got := StatusInvalidClient.Err().Error(); got != "driver returned NV_ERR_INVALID_CLIENT (0x23)" {
		t.Errorf("message %q", got)
	}
	// Every named status has a distinct sentinel.
	seen := map[error]Status{}
	for s, e := range statusErrors {
		if o, dup := seen[e]; dup {
			t.Errorf("statuses %#x and %#x share %v", uint32(s), uint32(o), e)
		}
		seen[e] = s
	}
}
