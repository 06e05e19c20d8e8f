package rego

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
)

//go:embed all:lib all:default all:examples
var files embed.FS

// FS returns every embedded policy file: lib/, default/ and examples/NAME/.
func FS() fs.FS { return files }

// Library returns the shared helper library (package arbiter.lib) that
// every policy may import; the policy loader adds it to policies that do not
// bring their own.
func Library() fs.FS { return sub("lib") }

// Default returns the default policy, applied when no policy is configured.
func Default() fs.FS { return sub("default") }

// Examples lists the example policies by name, sorted.
func Examples() []string {
	ents, _ := fs.ReadDir(files, "examples")
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

// Example returns the example policy called name.
func Example(name string) (fs.FS, error) {
	if _, err := fs.Stat(files, "examples/"+name); err != nil {
		return nil, fmt.Errorf("no example policy %q (have %v)", name, Examples())
	}
	return sub("examples/" + name), nil
}

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		panic(err) // dir is a constant embedded above
	}
	return f
}
