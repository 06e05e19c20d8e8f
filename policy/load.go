package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"sigs.k8s.io/yaml"

	"github.com/gpu-arbiter/arbiter/internal/yamlsyntax"
	"github.com/gpu-arbiter/arbiter/policy/schema"
	"github.com/gpu-arbiter/arbiter/rego"
)

// Source is a policy's files, read and parsed but not compiled.
type Source struct {
	// Name is the directory or bundle the files came from, for messages.
	Name string
	// Revision identifies the content: the bundle manifest's revision when
	// it has one, else a hash of every file read.
	Revision string
	// Modules are the parsed Rego files keyed by file name, the embedded
	// library included unless the policy brings its own package arbiter.lib.
	Modules map[string]*ast.Module
	// Data is the merged content of every data.json and data.yaml.
	Data map[string]any
	// Library says where package arbiter.lib comes from.
	Library LibraryOrigin
	// Signature says whether the bundle the files came from was signed and
	// its signature verified; empty for a directory.
	Signature Signature
}

// LibraryOrigin says where a policy's helper library (package arbiter.lib)
// comes from.
type LibraryOrigin string

// The origins of a policy's helper library.
const (
	// LibraryEmbedded: the loader added the embedded library (or
	// Options.Library); its modules are named "<arbiter>/lib/...".
	LibraryEmbedded LibraryOrigin = "embedded"
	// LibraryOwn: the policy's own files define package arbiter.lib.
	LibraryOwn LibraryOrigin = "own"
	// LibraryNone: no library (Options.NoLibrary).
	LibraryNone LibraryOrigin = "none"
)

// embeddedPrefix starts the names of the modules the loader adds.
const embeddedPrefix = "<arbiter>/"

// Files returns the names of the policy's own Rego files, tests included
// and the added library excluded, sorted.
func (s *Source) Files() []string {
	files := make([]string, 0, len(s.Modules))
	for f := range s.Modules {
		if !strings.HasPrefix(f, embeddedPrefix) {
			files = append(files, f)
		}
	}
	sort.Strings(files)
	return files
}

// Size limits applied when reading a policy unless Options says otherwise.
const (
	DefaultMaxFileBytes  = 4 << 20
	DefaultMaxTotalBytes = 32 << 20
)

// Read reads the policy at path: a directory, or an OPA bundle (.tar.gz).
func Read(path string, opts *Options) (*Source, error) {
	o := opts.withDefaults()
	if strings.HasSuffix(path, ".tar.gz") || strings.HasSuffix(path, ".tgz") {
		return readBundle(path, o)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("read policy %s: a file, not a policy: a policy is a directory, read with every subdirectory, or an OPA bundle (.tar.gz); give the directory that holds it, %s", path, filepath.Dir(path))
	}
	return ReadFS(os.DirFS(path), path, &o)
}

// ReadFS reads a policy from the root of fsys; name is used in file names
// and messages. Names starting with "." are skipped, so editors' swap files
// and the ..data directories of a Kubernetes ConfigMap volume are ignored
// (the files themselves are reached through the volume's symlinks).
func ReadFS(fsys fs.FS, name string, opts *Options) (*Source, error) {
	o := opts.withDefaults()
	files := map[string][]byte{}
	var total int64
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := path.Base(p)
		if p != "." && strings.HasPrefix(base, ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() || !isPolicyFile(base) {
			return nil
		}
		fi, err := fs.Stat(fsys, p) // follows symlinks
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		if fi.Size() > o.MaxFileBytes {
			return fmt.Errorf("%s: %d bytes, over the %d-byte limit for one policy file (Options.MaxFileBytes)", filepath.Join(name, p), fi.Size(), o.MaxFileBytes)
		}
		if total += fi.Size(); total > o.MaxTotalBytes {
			return fmt.Errorf("%s: policy files exceed %d bytes in all (Options.MaxTotalBytes)", name, o.MaxTotalBytes)
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files[p] = b
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read policy %s: %w", name, err)
	}
	return parseFiles(name, files, "", o)
}

func isPolicyFile(base string) bool {
	return strings.HasSuffix(base, ".rego") || base == "data.json" || base == "data.yaml" || base == "data.yml"
}

// parseFiles parses Rego files and merges data files. Data in a/b/data.json
// lands under data.a.b, as OPA's loader does.
func parseFiles(name string, files map[string][]byte, revision string, o Options) (*Source, error) {
	src := &Source{Name: name, Modules: map[string]*ast.Module{}, Data: map[string]any{}}
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	h := sha256.New()
	var diags []Diagnostic
	for _, p := range names {
		b := files[p]
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		file := filepath.Join(name, filepath.FromSlash(p))
		if strings.HasSuffix(p, ".rego") {
			m, err := parseModule(file, b)
			if err != nil {
				diags = append(diags, diagnostics(err)...)
				continue
			}
			src.Modules[file] = m
			continue
		}
		if err := mergeData(src.Data, p, b); err != nil {
			diags = append(diags, Diagnostic{Code: CodeData, File: file, Message: err.Error()})
		}
	}
	sum := hex.EncodeToString(h.Sum(nil))[:12]
	if len(diags) > 0 {
		return nil, &Error{Source: name, Revision: sum, Diagnostics: diags}
	}
	if len(src.Modules) == 0 {
		return nil, &Error{Source: name, Diagnostics: []Diagnostic{{Code: CodeLoad, File: name, Message: "no .rego files found"}}}
	}
	if diags := severalPolicies(name, src.Modules); diags != nil {
		return nil, &Error{Source: name, Revision: sum, Diagnostics: diags}
	}
	if diags := annotationClash(src.Modules); diags != nil {
		return nil, &Error{Source: name, Revision: sum, Diagnostics: diags}
	}
	src.Revision = revision
	if src.Revision == "" {
		src.Revision = sum
	}
	switch {
	case definesPackage(src.Modules, libPackage):
		src.Library = LibraryOwn
	case o.NoLibrary:
		src.Library = LibraryNone
	default:
		if err := addLibrary(src, o.Library); err != nil {
			return nil, err
		}
		src.Library = LibraryEmbedded
	}
	return src, nil
}

func parseModule(file string, b []byte) (*ast.Module, error) {
	if bytes.IndexByte(b, 0) >= 0 {
		// The parser would report every NUL; one clear message is better.
		off := bytes.IndexByte(b, 0)
		return nil, &Error{Diagnostics: []Diagnostic{{Code: ast.ParseErr, File: file, Row: 1 + bytes.Count(b[:off], []byte("\n")), Col: 1 + off - (bytes.LastIndexByte(b[:off], '\n') + 1),
			Message: fmt.Sprintf("binary content (NUL byte at offset %d): not a Rego file", off)}}}
	}
	return ast.ParseModuleWithOpts(file, string(b), ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true})
}

// libPackage is the package of the shared helper library in rego/lib.
const libPackage = "data.arbiter.lib"

func definesPackage(mods map[string]*ast.Module, pkg string) bool {
	for _, m := range mods {
		if m.Package.Path.String() == pkg {
			return true
		}
	}
	return false
}

// addLibrary adds the helper library's non-test files, so that a policy
// directory holds only the operator's own files.
func addLibrary(src *Source, lib fs.FS) error {
	if lib == nil {
		lib = rego.Library()
	}
	return fs.WalkDir(lib, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".rego") || strings.HasSuffix(p, "_test.rego") {
			return nil
		}
		b, err := fs.ReadFile(lib, p)
		if err != nil {
			return err
		}
		file := embeddedPrefix + "lib/" + p
		m, err := parseModule(file, b)
		if err != nil {
			return fmt.Errorf("helper library: %w", err)
		}
		src.Modules[file] = m
		return nil
	})
}

func mergeData(dst map[string]any, p string, b []byte) error {
	if strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml") {
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			return fmt.Errorf("yaml: %w", yamlsyntax.Wrap(err, b))
		}
		b = j
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("json at byte offset %d: %w", se.Offset, err)
		}
		return fmt.Errorf("json: %w", err)
	}
	if dec.More() {
		return errors.New("json: more than one value in the file")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("the top level must be an object, got %s", schema.TypeName(v))
	}
	node := dst
	if dir := path.Dir(p); dir != "." {
		for _, k := range strings.Split(dir, "/") {
			next, ok := node[k].(map[string]any)
			if !ok {
				if _, taken := node[k]; taken {
					return fmt.Errorf("data path %s is already a value", dir)
				}
				next = map[string]any{}
				node[k] = next
			}
			node = next
		}
	}
	return mergeInto(node, m, path.Dir(p))
}

func mergeInto(dst, src map[string]any, at string) error {
	for k, v := range src {
		old, exists := dst[k]
		if !exists {
			dst[k] = v
			continue
		}
		om, ok1 := old.(map[string]any)
		nm, ok2 := v.(map[string]any)
		if !ok1 || !ok2 {
			return fmt.Errorf("data key %s.%s is defined twice", at, k)
		}
		if err := mergeInto(om, nm, at+"."+k); err != nil {
			return err
		}
	}
	return nil
}
