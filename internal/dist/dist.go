// Package dist builds Arbiter's .deb and .rpm packages with nfpm, from the
// package description in deploy/nfpm.yaml and binaries built by `make
// dist`.
//
// It is a Go module of its own: nfpm's file globbing needs an older
// github.com/gobwas/glob than OPA, which the daemon's module uses, and the
// two cannot share one build. Nothing here is linked into the arbiter
// binary.
package dist

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

// Formats are the package formats built, in order.
var Formats = []string{"deb", "rpm"}

// Arches are the Go architectures packaged; nfpm names them per format
// (arm64 is aarch64 in an rpm, amd64 is x86_64).
var Arches = []string{"amd64", "arm64"}

// Options says what to package.
type Options struct {
	// Root is the repository root; relative paths in the package
	// description (sources, scripts) are relative to it.
	Root string
	// Description is the nfpm description; default Root/deploy/nfpm.yaml.
	Description string
	// Version is the version as `git describe` or a tag spells it; it is
	// turned into one deb and rpm accept (see PackageVersion).
	Version string
	// Binaries maps a Go architecture (amd64, arm64) to the arbiter binary
	// built for it. One package per format is built for each.
	Binaries map[string]string
	// Out is the directory the packages are written to (created).
	Out string
	// Formats limits the formats built; default Formats.
	Formats []string
}

// Build writes one package per format and architecture into o.Out and
// returns their paths, sorted.
func Build(o Options) ([]string, error) {
	if o.Root == "" || o.Out == "" || o.Version == "" || len(o.Binaries) == 0 {
		return nil, errors.New("dist: Root, Out, Version and at least one binary are required")
	}
	if o.Description == "" {
		o.Description = filepath.Join(o.Root, "deploy", "nfpm.yaml")
	}
	formats := o.Formats
	if len(formats) == 0 {
		formats = Formats
	}
	version, err := PackageVersion(o.Version)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("dist: output directory: %w", err)
	}
	arches := make([]string, 0, len(o.Binaries))
	for a := range o.Binaries {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	var out []string
	for _, arch := range arches {
		if !slices.Contains(Arches, arch) {
			return nil, fmt.Errorf("dist: architecture %q is not packaged (have %s)", arch, strings.Join(Arches, ", "))
		}
		bin, err := filepath.Abs(o.Binaries[arch])
		if err != nil {
			return nil, err
		}
		if st, err := os.Stat(bin); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("dist: the %s binary %s is missing or not a file (run make dist): %v", arch, bin, err)
		}
		env := map[string]string{"ARCH": arch, "VERSION": version, "BINARY": bin}
		for _, format := range formats {
			p, err := buildOne(o, format, env)
			if err != nil {
				return nil, fmt.Errorf("dist: %s %s: %w", format, arch, err)
			}
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out, nil
}

// buildOne writes the package of one format for the variables in env.
func buildOne(o Options, format string, env map[string]string) (string, error) {
	cfg, err := nfpm.ParseFileWithEnvMapping(o.Description, func(k string) string { return env[k] })
	if err != nil {
		return "", fmt.Errorf("read %s: %w", o.Description, err)
	}
	info, err := cfg.Get(format)
	if err != nil {
		return "", err
	}
	info = nfpm.WithDefaults(info)
	rootRelative(info, o.Root)
	if err := nfpm.Validate(info); err != nil {
		return "", fmt.Errorf("%s: %w", o.Description, err)
	}
	packager, err := nfpm.Get(format)
	if err != nil {
		return "", err
	}
	target := filepath.Join(o.Out, packager.ConventionalFileName(info))
	f, err := os.Create(target)
	if err != nil {
		return "", err
	}
	if err := packager.Package(info, f); err != nil {
		f.Close()
		os.Remove(target)
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return target, nil
}

// rootRelative makes the description's relative source and script paths
// relative to root rather than to the working directory.
func rootRelative(info *nfpm.Info, root string) {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(root, p)
	}
	for _, c := range info.Contents {
		c.Source = abs(c.Source)
	}
	s := &info.Scripts
	for _, p := range []*string{&s.PreInstall, &s.PostInstall, &s.PreRemove, &s.PostRemove} {
		*p = abs(*p)
	}
}

// release matches the start of a released version: MAJOR.MINOR.
var release = regexp.MustCompile(`^[0-9]+\.[0-9]+`)

// PackageVersion turns a version as `git describe --tags` spells it into
// one that both dpkg and rpm accept and order rightly:
//
//	v1.2.0               -> 1.2.0
//	v1.2.0-3-gabc1234    -> 1.2.0+3.gabc1234 (after 1.2.0)
//	abc1234-dirty, dev   -> 0.0.0~abc1234.dirty (before any release)
//
// A version with a character neither format allows is an error.
func PackageVersion(v string) (string, error) {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if v == "" {
		return "", errors.New("dist: empty version")
	}
	for _, r := range v {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || strings.ContainsRune(".+~-_", r)) {
			return "", fmt.Errorf("dist: version %q has %q, which a package version cannot hold", v, r)
		}
	}
	v = strings.ReplaceAll(v, "_", ".")
	if !release.MatchString(v) {
		// A commit hash (git describe on a tree without tags), even one
		// that starts with a digit, or a word such as "dev".
		return "0.0.0~" + strings.ReplaceAll(v, "-", "."), nil
	}
	if head, tail, ok := strings.Cut(v, "-"); ok {
		return head + "+" + strings.ReplaceAll(tail, "-", "."), nil
	}
	return v, nil
}
