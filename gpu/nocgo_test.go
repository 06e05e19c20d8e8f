//go:build !cgo

package gpu_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/gpu"
)

func TestOpenWithoutCgo(t *testing.T) {
	inv, err := gpu.Open(nil)
	if inv != nil || !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "built without cgo") ||
		!strings.Contains(err.Error(), "driver trace") {
		t.Fatalf("Open: %v, %v; want ErrUnavailable saying the build has no cgo", inv, err)
	}
	if a := gpu.Check(nil, nil); a.OK || !strings.Contains(a.Detail, "built without cgo") || a.Fix == "" {
		t.Errorf("Check: %+v", a)
	}
}
