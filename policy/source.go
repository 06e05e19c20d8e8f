package policy

import (
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/gpu-arbiter/arbiter/policy/input"
)

// inputSource serves a classification input path by path to a compiled
// plan (irvm.InputSource): the plan asks only for what the policy reads,
// and the objects on the way to it are never built. Every answer is the
// value Input.value would put at that path.
type inputSource struct {
	in   *Input
	gpus ast.Value // the node's GPU list, cached by the policy
}

func (s *inputSource) Value(path []string) *ast.Term { return s.at(path, true) }

func (s *inputSource) Has(path []string) bool { return s.at(path, false) != nil }

// at resolves path; without build it only says whether there is a value,
// answering present instead of building it.
func (s *inputSource) at(path []string, build bool) *ast.Term {
	if len(path) == 0 {
		return built(build, func() ast.Value { return s.in.value(s.gpus) })
	}
	switch path[0] {
	case "apiVersion":
		return leaf(path, apiVersionTerm)
	case "node":
		return s.in.Node.at(path[1:], s.gpus, build)
	case "process":
		return processAt(s.in.Process, path[1:], build)
	}
	return nil
}

// present answers Has for a value that is there but not built.
var present = ast.InternedTerm(true)

// built is the composite value v builds, or present when only asked
// whether there is one.
func built(build bool, v func() ast.Value) *ast.Term {
	if !build {
		return present
	}
	return ast.NewTerm(v())
}

// leaf is t when path ends at it: a path cannot go into a scalar.
func leaf(path []string, t *ast.Term) *ast.Term {
	if len(path) != 1 {
		return nil
	}
	return t
}

func (n Node) at(path []string, gpus ast.Value, build bool) *ast.Term {
	if len(path) == 0 {
		return built(build, func() ast.Value { return n.value(gpus) })
	}
	switch path[0] {
	case "hostname":
		return leaf(path, strTerm(n.Hostname))
	case "time":
		return leaf(path, n.timeTerm())
	case "gpus":
		if gpus == nil {
			gpus = gpusValue(n.GPUs)
		}
		return leaf(path, built(build, func() ast.Value { return gpus }))
	}
	return nil
}

func processAt(p input.Process, path []string, build bool) *ast.Term {
	if len(path) == 0 {
		return built(build, func() ast.Value { return processValue(p) })
	}
	switch path[0] {
	case "pid":
		return leaf(path, ast.InternedTerm(p.PID))
	case "ppid":
		return leaf(path, ast.InternedTerm(p.PPID))
	case "uid":
		return leaf(path, ast.InternedTerm(p.UID))
	case "comm":
		return leaf(path, strTerm(p.Comm))
	case "exe":
		return leaf(path, strTerm(p.Exe))
	case "user":
		return leaf(path, strTerm(p.User))
	case "cmdline":
		return leaf(path, built(build, func() ast.Value { return strs(p.Cmdline) }))
	case "gpus":
		return leaf(path, built(build, func() ast.Value { return ints(p.GPUs) }))
	case "env":
		return mapAt(p.Env, path[1:], build)
	case "cgroup":
		return cgroupAt(p.Cgroup, path[1:], build)
	case "pod":
		if p.Pod == nil {
			return nil
		}
		return podAt(*p.Pod, path[1:], build)
	}
	return nil
}

func cgroupAt(c input.Cgroup, path []string, build bool) *ast.Term {
	if len(path) == 0 {
		return built(build, func() ast.Value { return cgroupValue(c) })
	}
	for _, f := range cgroupFields {
		if f.key == path[0] {
			return leaf(path, strTerm(f.get(&c)))
		}
	}
	return nil
}

func podAt(pod input.Pod, path []string, build bool) *ast.Term {
	if len(path) == 0 {
		return built(build, func() ast.Value { return podValue(pod) })
	}
	switch path[0] {
	case "uid":
		return leaf(path, strTerm(pod.UID))
	case "namespace":
		return leaf(path, strTerm(pod.Namespace))
	case "name":
		return leaf(path, strTerm(pod.Name))
	case "labels":
		return mapAt(pod.Labels, path[1:], build)
	}
	return nil
}

// mapAt is a string map (env, labels) or one of its values.
func mapAt(m map[string]string, path []string, build bool) *ast.Term {
	switch len(path) {
	case 0:
		return built(build, func() ast.Value { return strMap(m) })
	case 1:
		if v, ok := m[path[0]]; ok {
			return strTerm(v)
		}
	}
	return nil
}

// strTerm is the term str() puts in an object for s.
func strTerm(s string) *ast.Term { return str("", s)[1] }
