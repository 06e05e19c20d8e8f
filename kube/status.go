package kube

import (
	"fmt"
	"strings"
	"time"
)

// Health is the condition of one source of pod metadata.
type Health struct {
	// Source is SourceAPIServer or SourcePodResources.
	Source Source
	// State is what the source is doing.
	State State
	// Detail says what works, or what is wrong and how to fix it.
	Detail string
	// Pods is how many pods the source knows now.
	Pods int
	// Since is when State or Detail last changed.
	Since time.Time
}

// State is a source's condition.
type State int

// States of a source.
const (
	// StateStarting: not yet answered once.
	StateStarting State = iota
	// StateOK: the source answers; lookups use it.
	StateOK
	// StateDegraded: the source failed; lookups use what it last said, if
	// anything, and the cgroup path. It is retried.
	StateDegraded
	// StateDisabled: the source is turned off by configuration.
	StateDisabled
)

// String names the state.
func (s State) String() string {
	switch s {
	case StateStarting:
		return "starting"
	case StateOK:
		return "ok"
	case StateDegraded:
		return "degraded"
	case StateDisabled:
		return "disabled"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// String is the health as one log line.
func (h Health) String() string {
	s := fmt.Sprintf("%s: %s", h.Source, h.State)
	if h.Detail != "" {
		s += ": " + h.Detail
	}
	return s
}

// Status is the health of every source.
type Status struct {
	APIServer    Health
	PodResources Health
}

// String is the status as one line, saying what lookups fall back to.
func (s Status) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod metadata: %s; %s", s.APIServer, s.PodResources)
	switch {
	case s.APIServer.State == StateOK:
	case s.PodResources.State == StateOK:
		b.WriteString("; lookups answer namespace and name only for a process whose GPUs match one container, else the pod UID from the cgroup path")
	default:
		b.WriteString("; lookups answer the pod UID from the cgroup path only")
	}
	return b.String()
}
