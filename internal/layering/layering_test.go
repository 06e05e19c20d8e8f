package layering

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gpu-arbiter/arbiter"

// rule forbids packages matching from (a package path relative to the
// module root, or a prefix ending in "/...") to import any of deny.
type rule struct {
	from, why string
	deny      []string
}

var rules = []rule{
	{"engine/...", "the engine sees mechanisms only through its interfaces, and policy through its classifier interface: it carries neither eBPF, the driver, the simulator nor OPA",
		[]string{"uprobe/...", "nvrm/...", "gpu/...", "sim/...", "web/...", "cmd/...", "policy/...", "bpf/...", "github.com/open-policy-agent/..."}},
	{"uprobe/...", "a mechanism", []string{"engine/...", "policy/...", "web/...", "sim/...", "cmd/..."}},
	{"nvrm/...", "a mechanism", []string{"engine/...", "policy/...", "web/...", "sim/...", "cmd/..."}},
	{"gpu/...", "a mechanism", []string{"engine/...", "policy/...", "web/...", "sim/...", "cmd/..."}},
	{"sim", "the simulated GPU is a mechanism; only sim/whatif runs the engine on it", []string{"engine/...", "policy/...", "web/...", "cmd/...", "github.com/open-policy-agent/..."}},
	{"sim/workload", "workload models know nothing of the engine", []string{"engine/...", "policy/...", "web/...", "cmd/..."}},
	{"sim/report", "reports know nothing of the engine", []string{"engine/...", "policy/...", "web/...", "cmd/..."}},
	{"trace/...", "the event model is a leaf", []string{"engine/...", "policy/...", "web/...", "sim/...", "cmd/...", "uprobe/...", "nvrm/..."}},
	{"sched", "the shared vocabulary is a leaf", []string{"trace/...", "bpf/...", "uprobe/...", "nvrm/...", "gpu/...", "policy/...", "rego/...", "engine/...", "sim/...", "web/...", "cmd/...", "internal/..."}},
	{"procfs", "the /proc reader is a leaf that every package may import: the standard library and golang.org/x/sys only",
		[]string{"trace/...", "bpf/...", "uprobe/...", "nvrm/...", "gpu/...", "policy/...", "rego/...", "engine/...", "sched/...", "sim/...",
			"web/...", "cmd/...", "config/...", "kube/...", "internal/...", "github.com/...", "go.yaml.in/...", "sigs.k8s.io/...", "k8s.io/..."}},
	{"policy/...", "policy is plugged into the engine by cmd", []string{"engine/...", "web/...", "sim/...", "cmd/...", "uprobe/...", "nvrm/..."}},
}

// webImporters are the only packages that may import web.
var webImporters = []string{"cmd/..."}

// pending lists imports that break a rule today, each with what removes it.
// An entry that no longer matches an import fails the test: remove it.
var pending = map[string]string{}

func TestImportRules(t *testing.T) {
	root := moduleRoot(t)
	imports := packageImports(t, root)
	if len(imports) < 10 {
		t.Fatalf("found only %d packages under %s: the walk is broken", len(imports), root)
	}
	broken, seen := violations(imports)
	for _, v := range broken {
		t.Error(v)
	}
	for key, fix := range pending {
		if !seen[key] {
			t.Errorf("pending exception %q (%s) no longer matches an import: remove it", key, fix)
		}
	}
}

// TestRulesCatch checks that the rules catch what they forbid.
func TestRulesCatch(t *testing.T) {
	broken, _ := violations(map[string][]string{
		"engine":          {"trace", "nvrm", "github.com/open-policy-agent/opa/v1/rego"},
		"nvrm":            {"bpf", "engine"},
		"sim/whatif":      {"engine", "sim"},
		"policy":          {"web"},
		"cmd/arbiter":     {"web", "engine"},
		"internal/caps":   {"cmd/arbiter"},
		"uprobe/internal": {"policy/irvm"},
		"procfs":          {"golang.org/x/sys/unix", "trace", "github.com/cilium/ebpf"},
		"uprobe":          {"procfs"},
	})
	want := []string{"engine imports nvrm", "engine imports github.com/open-policy-agent/opa/v1/rego", "nvrm imports engine",
		"policy imports web", "internal/caps imports cmd/arbiter", "uprobe/internal imports policy/irvm",
		"procfs imports trace", "procfs imports github.com/cilium/ebpf"}
	if len(broken) != len(want) {
		t.Fatalf("violations:\n%s\nwant %d", strings.Join(broken, "\n"), len(want))
	}
	for _, w := range want {
		if !slices.ContainsFunc(broken, func(b string) bool { return strings.HasPrefix(b, w+":") }) {
			t.Errorf("no violation %q among:\n%s", w, strings.Join(broken, "\n"))
		}
	}
}

// violations returns every import that breaks a rule and is not pending,
// sorted, and which pending exceptions matched.
func violations(imports map[string][]string) ([]string, map[string]bool) {
	var out []string
	seen := map[string]bool{}
	for pkg, deps := range imports {
		for _, dep := range deps {
			var broken []string
			for _, r := range rules {
				if matches(r.from, pkg) && slices.ContainsFunc(r.deny, func(d string) bool { return matches(d, dep) }) {
					broken = append(broken, r.why)
				}
			}
			if matches("web/...", dep) && !slices.ContainsFunc(webImporters, func(p string) bool { return matches(p, pkg) }) {
				broken = append(broken, "only cmd imports web")
			}
			if matches("cmd/...", dep) {
				broken = append(broken, "nothing imports a command")
			}
			if len(broken) == 0 {
				continue
			}
			key := pkg + " -> " + dep
			if _, ok := pending[key]; ok {
				seen[key] = true
				continue
			}
			out = append(out, pkg+" imports "+dep+": "+strings.Join(broken, "; "))
		}
	}
	slices.Sort(out)
	return out, seen
}

// matches reports whether pkg (module-relative, or a full path outside the
// module) is pattern or, for "P/...", P or below it.
func matches(pattern, pkg string) bool {
	if p, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == p || strings.HasPrefix(pkg, p+"/")
	}
	return pkg == pattern
}

// packageImports parses every non-test Go file under root and returns, per
// package directory (module-relative), its imports: module packages
// module-relative, others by full path.
func packageImports(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		for _, spec := range f.Imports {
			dep, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			if r, ok := strings.CutPrefix(dep, module+"/"); ok {
				dep = r
			}
			if !slices.Contains(out[pkg], dep) {
				out[pkg] = append(out[pkg], dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// moduleRoot finds the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			if !strings.Contains(string(b), "module "+module+"\n") {
				t.Fatalf("%s/go.mod is not module %s", dir, module)
			}
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
