package main

import (
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/web"
)

// TestStatusText: arbiter status counts with nouns that agree ("1 file",
// "1 reload", "1 error") and says how many GPUs there are, not a GPU
// number; it says where to find the unmanaged processes.
func TestStatusText(t *testing.T) {
	st := web.StatusView{
		Version: "v", Ready: true,
		Policy: &web.PolicyStatus{Revision: "abc", Files: []string{"p.rego"}, Reloads: 1},
		Engine: web.StatsView{Events: 1, Requests: 1, Suspends: 1, Gates: 1, EnforceErrors: 1},
		Counts: web.Counts{Processes: 2, Unmanaged: 1},
	}
	var b strings.Builder
	if err := writeStatus(&b, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"policy: revision abc (1 file), 1 reload, 0 rejected\n", "\n0 GPUs\n", "processes: 2 (1 unmanaged: arbiter ps says which and why)\n",
		"engine: 1 event, 1 request, 1 suspend, 1 gate, 1 enforcement error, 0 preemptions recorded\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}
