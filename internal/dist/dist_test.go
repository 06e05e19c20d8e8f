package dist

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	rpmutils "github.com/sassoftware/go-rpmutils"
)

func TestPackageVersion(t *testing.T) {
	cases := []struct{ in, want, wantErr string }{
		{"v1.2.0", "1.2.0", ""},
		{"1.2.0", "1.2.0", ""},
		{"v1.2.0-3-gabc1234", "1.2.0+3.gabc1234", ""},
		{"v1.2.0-3-gabc1234-dirty", "1.2.0+3.gabc1234.dirty", ""},
		{"abc1234-dirty", "0.0.0~abc1234.dirty", ""},
		{"636bf0c-dirty", "0.0.0~636bf0c.dirty", ""},
		{"1234567", "0.0.0~1234567", ""},
		{"dev", "0.0.0~dev", ""},
		{"", "", "empty version"},
		{"1.0 beta", "", `has ' '`},
		{"1.0/x", "", `has '/'`},
	}
	for _, tc := range cases {
		got, err := PackageVersion(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("PackageVersion(%q) = %q, %v; want error %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("PackageVersion(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestBuildErrors(t *testing.T) {
	root := repoRoot(t)
	out := t.TempDir()
	cases := []struct {
		o    Options
		want string
	}{
		{Options{Root: root, Out: out, Version: "1"}, "at least one binary"},
		{Options{Root: root, Out: out, Version: "1", Binaries: map[string]string{"riscv64": "/bin/true"}}, `architecture "riscv64" is not packaged`},
		{Options{Root: root, Out: out, Version: "1", Binaries: map[string]string{"amd64": filepath.Join(out, "none")}}, "missing or not a file (run make dist)"},
		{Options{Root: root, Out: out, Version: "1 2", Binaries: map[string]string{"amd64": "/bin/true"}}, "cannot hold"},
	}
	for _, tc := range cases {
		if _, err := Build(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build(%+v) = %v, want an error containing %q", tc.o, err, tc.want)
		}
	}
}

// The version `make dist` is given in TestMakeDist, and what the packages
// must call it.
const (
	testVersion    = "v1.2.3-4-gabc1234"
	testPkgVersion = "1.2.3+4.gabc1234"
)

// entry is one file, directory or link of a package.
type entry struct {
	mode os.FileMode // permission bits
	dir  bool
	data []byte
	// rpmFlags are the rpm file flags (RPMFILE_CONFIG, ...); 0 in a deb.
	rpmFlags int
}

// pkg is what a test reads out of a package.
type pkg struct {
	files    map[string]entry
	scripts  map[string][]byte // postinst/prerm/postrm, by the deb's names
	conffile []string
	arch     string
	version  string
}

// TestMakeDist runs `make dist` as a user would, into a temporary
// directory, and opens every package it writes: the file list, modes and
// contents, the configuration files, the scripts, the architecture and the
// version; and every SHA256SUMS line.
func TestMakeDist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds arbiter for two architectures and four packages")
	}
	root := repoRoot(t)
	out := t.TempDir()
	cmd := exec.Command("make", "-C", root, "dist", "DIST="+out, "VERSION="+testVersion)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make dist: %v\n%s", err, b)
	}

	sums := checkSums(t, out)
	want := []string{"arbiter-linux-amd64", "arbiter-linux-arm64",
		"arbiter-" + testPkgVersion + "-1.aarch64.rpm", "arbiter-" + testPkgVersion + "-1.x86_64.rpm",
		"arbiter_" + testPkgVersion + "_amd64.deb", "arbiter_" + testPkgVersion + "_arm64.deb"}
	slices.Sort(want)
	if got := slices.Sorted(maps.Keys(sums)); !slices.Equal(got, want) {
		t.Fatalf("SHA256SUMS lists %v, want %v", got, want)
	}
	checkBinaries(t, root, out)

	for _, name := range want {
		var p pkg
		switch filepath.Ext(name) {
		case ".deb":
			p = readDeb(t, filepath.Join(out, name))
		case ".rpm":
			p = readRPM(t, filepath.Join(out, name))
		default:
			continue
		}
		t.Run(name, func(t *testing.T) { checkPackage(t, root, out, name, p) })
	}
}

// checkPackage compares one package with the files it must install.
func checkPackage(t *testing.T, root, out, name string, p pkg) {
	isRPM := strings.HasSuffix(name, ".rpm")
	goArch := "amd64"
	if strings.Contains(name, "arm64") || strings.Contains(name, "aarch64") {
		goArch = "arm64"
	}
	wantArch := map[bool]map[string]string{false: {"amd64": "amd64", "arm64": "arm64"}, true: {"amd64": "x86_64", "arm64": "aarch64"}}[isRPM][goArch]
	if p.arch != wantArch || p.version != testPkgVersion {
		t.Errorf("architecture %q version %q, want %q %q", p.arch, p.version, wantArch, testPkgVersion)
	}

	type want struct {
		src  string
		mode os.FileMode
	}
	files := map[string]want{
		"/usr/bin/arbiter":                        {filepath.Join(out, "arbiter-linux-"+goArch), 0o755},
		"/usr/lib/systemd/system/arbiter.service": {filepath.Join(root, "deploy/systemd/arbiter.service"), 0o644},
		"/etc/arbiter/config.yaml":                {filepath.Join(root, "deploy/config.yaml"), 0o644},
		"/usr/share/doc/arbiter/README.md":        {filepath.Join(root, "README.md"), 0o644},
		"/usr/share/doc/arbiter/install.md":       {filepath.Join(root, "docs/install.md"), 0o644},
	}
	if isRPM {
		files["/usr/share/licenses/arbiter/LICENSE"] = want{filepath.Join(root, "LICENSE"), 0o644}
	} else {
		files["/usr/share/doc/arbiter/copyright"] = want{filepath.Join(root, "LICENSE"), 0o644}
	}
	// The default policy: what package rego embeds as its Default().
	policies, err := filepath.Glob(filepath.Join(root, "rego/default/*.rego"))
	if err != nil || len(policies) == 0 {
		t.Fatalf("no default policy in rego/default: %v", err)
	}
	wantConf := []string{"/etc/arbiter/config.yaml"}
	for _, src := range policies {
		dst := "/etc/arbiter/policy.d/" + filepath.Base(src)
		files[dst] = want{src, 0o644}
		wantConf = append(wantConf, dst)
	}
	slices.Sort(wantConf)

	var regular []string
	for path, e := range p.files {
		if !e.dir {
			regular = append(regular, path)
		}
	}
	slices.Sort(regular)
	if wantList := slices.Sorted(maps.Keys(files)); !slices.Equal(regular, wantList) {
		t.Errorf("files\n%s\nwant\n%s", strings.Join(regular, "\n"), strings.Join(wantList, "\n"))
	}
	for path, w := range files {
		e, ok := p.files[path]
		if !ok {
			continue
		}
		if e.mode != w.mode {
			t.Errorf("%s: mode %v, want %v", path, e.mode, w.mode)
		}
		b, err := os.ReadFile(w.src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(e.data, b) {
			t.Errorf("%s differs from %s (%d bytes, want %d)", path, w.src, len(e.data), len(b))
		}
	}
	if d, ok := p.files["/etc/arbiter/policy.d"]; !ok || !d.dir || d.mode != 0o755 {
		t.Errorf("/etc/arbiter/policy.d: %+v, want a directory with mode 0755", d)
	}
	if !slices.Equal(p.conffile, wantConf) {
		t.Errorf("configuration files %v, want %v", p.conffile, wantConf)
	}
	if isRPM {
		for path, flag := range map[string]int{"/usr/share/licenses/arbiter/LICENSE": rpmutils.RPMFILE_LICENSE, "/usr/share/doc/arbiter/README.md": rpmutils.RPMFILE_DOC} {
			if p.files[path].rpmFlags&flag == 0 {
				t.Errorf("%s: rpm flags %#x lack %#x", path, p.files[path].rpmFlags, flag)
			}
		}
	}

	// The scripts are deploy/scripts/*.sh, whose behaviour the deploy
	// package's tests check: never enable or start, stop and recover on
	// removal.
	for script, src := range map[string]string{"postinst": "postinstall.sh", "prerm": "preremove.sh", "postrm": "postremove.sh"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy/scripts", src))
		if err != nil {
			t.Fatal(err)
		}
		if got := p.scripts[script]; !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(b)) {
			t.Errorf("%s is not deploy/scripts/%s:\n%s", script, src, got)
		}
	}
	if len(p.scripts) != 3 {
		t.Errorf("scripts %v, want exactly postinst, prerm and postrm", slices.Sorted(maps.Keys(p.scripts)))
	}
}

// readDeb opens a .deb: an ar archive of debian-binary, control.tar.gz and
// data.tar.gz.
func readDeb(t *testing.T, path string) pkg {
	t.Helper()
	members := readAr(t, path)
	if string(members["debian-binary"]) != "2.0\n" {
		t.Fatalf("%s: debian-binary %q", path, members["debian-binary"])
	}
	p := pkg{files: map[string]entry{}, scripts: map[string][]byte{}}
	for name, e := range readTarGz(t, members["data.tar.gz"]) {
		p.files[strings.TrimSuffix(strings.TrimPrefix(name, "."), "/")] = e
	}
	delete(p.files, "")
	control := readTarGz(t, members["control.tar.gz"])
	for name, e := range control {
		name = strings.TrimPrefix(name, "./")
		switch name {
		case "postinst", "prerm", "postrm", "preinst":
			if e.mode&0o111 == 0 {
				t.Errorf("%s: %s is not executable (%v)", path, name, e.mode)
			}
			p.scripts[name] = e.data
		case "conffiles":
			p.conffile = strings.Fields(string(e.data))
			slices.Sort(p.conffile)
		case "control":
			for line := range strings.Lines(string(e.data)) {
				if v, ok := strings.CutPrefix(line, "Architecture: "); ok {
					p.arch = strings.TrimSpace(v)
				}
				if v, ok := strings.CutPrefix(line, "Version: "); ok {
					p.version = strings.TrimSpace(v)
				}
			}
		}
	}
	return p
}

// readAr reads every member of an ar archive (the common format, as dpkg
// writes it: "!<arch>\n", then a 60-byte header and the data, padded to an
// even length, per member).
func readAr(t *testing.T, path string) map[string][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const magic = "!<arch>\n"
	if !bytes.HasPrefix(b, []byte(magic)) {
		t.Fatalf("%s is not an ar archive", path)
	}
	out := map[string][]byte{}
	for rest := b[len(magic):]; len(rest) > 0; {
		if len(rest) < 60 || string(rest[58:60]) != "`\n" {
			t.Fatalf("%s: bad ar member header %q", path, rest[:min(60, len(rest))])
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(rest[0:16])), "/")
		size, err := strconv.Atoi(strings.TrimSpace(string(rest[48:58])))
		if err != nil || 60+size > len(rest) {
			t.Fatalf("%s: member %s: bad size %q", path, name, rest[48:58])
		}
		out[name] = rest[60 : 60+size]
		rest = rest[60+size+size%2:]
	}
	return out
}

func readTarGz(t *testing.T, b []byte) map[string]entry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]entry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = entry{mode: os.FileMode(h.Mode).Perm(), dir: h.Typeflag == tar.TypeDir, data: data}
	}
}

// readRPM opens an .rpm with go-rpmutils: its header (files, flags,
// scripts) and its payload (contents).
func readRPM(t *testing.T, path string) pkg {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := rpmutils.ReadRpm(bufio.NewReader(f))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	p := pkg{files: map[string]entry{}, scripts: map[string][]byte{}}
	if p.arch, err = r.Header.GetString(rpmutils.ARCH); err != nil {
		t.Fatal(err)
	}
	if p.version, err = r.Header.GetString(rpmutils.VERSION); err != nil {
		t.Fatal(err)
	}
	for tag, name := range map[int]string{rpmutils.PREIN: "preinst", rpmutils.POSTIN: "postinst", rpmutils.PREUN: "prerm", rpmutils.POSTUN: "postrm"} {
		if r.Header.HasTag(tag) {
			s, err := r.Header.GetString(tag)
			if err != nil {
				t.Fatal(err)
			}
			p.scripts[name] = []byte(s)
		}
	}
	infos, err := r.Header.GetFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, fi := range infos {
		mode := os.FileMode(fi.Mode())
		e := entry{mode: mode.Perm(), dir: fi.Mode()&0o170000 == 0o040000, rpmFlags: fi.Flags()}
		p.files[fi.Name()] = e
		if fi.Flags()&rpmutils.RPMFILE_CONFIG != 0 {
			if fi.Flags()&rpmutils.RPMFILE_NOREPLACE == 0 {
				t.Errorf("%s: %s is %%config without noreplace: an upgrade would overwrite the operator's edits", path, fi.Name())
			}
			p.conffile = append(p.conffile, fi.Name())
		}
	}
	slices.Sort(p.conffile)
	pr, err := r.PayloadReaderExtended()
	if err != nil {
		t.Fatal(err)
	}
	for {
		fi, err := pr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s payload: %v", path, err)
		}
		data, err := io.ReadAll(pr)
		if err != nil {
			t.Fatal(err)
		}
		e := p.files[fi.Name()]
		e.data = data
		p.files[fi.Name()] = e
	}
	return p
}

// checkSums verifies every line of out/SHA256SUMS and returns them by file.
func checkSums(t *testing.T, out string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for line := range strings.Lines(string(b)) {
		sum, name, ok := strings.Cut(strings.TrimSpace(line), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not SUM  NAME", line)
		}
		data, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(data)
		if got := hex.EncodeToString(h[:]); got != sum {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %s", name, got, sum)
		}
		sums[name] = sum
	}
	return sums
}

// checkBinaries checks that each binary is an executable for its
// architecture, static while the Makefile's build line turns cgo off, and
// runs the one for this machine to read its version.
func checkBinaries(t *testing.T, root, out string) {
	t.Helper()
	static := staticBuild(t, root)
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		path := filepath.Join(out, "arbiter-linux-"+arch)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != machine {
			t.Errorf("%s: machine %v, want %v", path, f.Machine, machine)
		}
		for _, prog := range f.Progs {
			if static && prog.Type == elf.PT_INTERP {
				t.Errorf("%s has an interpreter: not static (CGO_ENABLED=0)", path)
			}
		}
		f.Close()
	}
	host := map[string]string{"x86_64": "amd64", "aarch64": "arm64"}[unameMachine(t)]
	if host == "" {
		return
	}
	b, err := exec.Command(filepath.Join(out, "arbiter-linux-"+host), "version").CombinedOutput()
	if err != nil || !strings.Contains(string(b), testVersion) {
		t.Errorf("arbiter version = %q, %v; want it to print %s", b, err, testVersion)
	}
}

// staticBuild reports whether the Makefile's one build line (GOBUILD)
// builds without cgo, and so a static binary.
func staticBuild(t *testing.T, root string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "GOBUILD") {
			return strings.Contains(line, "CGO_ENABLED=0")
		}
	}
	t.Fatal("the Makefile has no GOBUILD line")
	return false
}

func unameMachine(t *testing.T) string {
	t.Helper()
	b, err := exec.Command("uname", "-m").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// repoRoot is the arbiter repository that holds this module.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.Contains(b, []byte("module github.com/gpu-arbiter/arbiter\n")) {
		t.Fatalf("%s is not the arbiter repository: %v", root, err)
	}
	return root
}
