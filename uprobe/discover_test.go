package uprobe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
)

func TestIsLibcuda(t *testing.T) {
	for name, want := range map[string]bool{
		"/usr/lib/libcuda.so": true, "libcuda.so.1": true, "/x/libcuda.so.550.54.15": true,
		"/usr/lib/libcudart.so.12": false, "libcudnn.so": false, "/libcuda.so/x": false, "libcuda.sox": false,
	} {
		if isLibcuda(name) != want {
			t.Errorf("isLibcuda(%q) = %v", name, !want)
		}
	}
}

// ldCache builds a new-format ld.so.cache image, optionally behind an
// old-format table.
func ldCache(entries [][2]string, old bool) []byte {
	var strs bytes.Buffer
	hdr := ldCacheNewHeader + len(entries)*ldCacheNewEntry
	var tab bytes.Buffer
	for _, e := range entries {
		k := hdr + strs.Len()
		strs.WriteString(e[0] + "\x00")
		v := hdr + strs.Len()
		strs.WriteString(e[1] + "\x00")
		binary.Write(&tab, binary.LittleEndian, [6]uint32{0x303, uint32(k), uint32(v), 0, 0, 0})
	}
	var b bytes.Buffer
	b.WriteString(ldCacheNewMagic)
	binary.Write(&b, binary.LittleEndian, [7]uint32{uint32(len(entries)), uint32(strs.Len()), 0, 0, 0, 0, 0})
	b.Write(tab.Bytes())
	b.Write(strs.Bytes())
	if !old {
		return b.Bytes()
	}
	var o bytes.Buffer
	o.WriteString(ldCacheOldMagic + "\x00")
	binary.Write(&o, binary.LittleEndian, uint32(1))
	o.Write(make([]byte, ldCacheOldEntry))
	for o.Len()%8 != 0 {
		o.WriteByte(0)
	}
	o.Write(b.Bytes())
	return o.Bytes()
}

func TestParseLdCache(t *testing.T) {
	entries := [][2]string{{"libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}, {"libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"}}
	for _, old := range []bool{false, true} {
		got, err := parseLdCache(ldCache(entries, old))
		if err != nil {
			t.Fatalf("old=%v: %v", old, err)
		}
		if len(got) != 2 || got[0] != entries[0] || got[1] != entries[1] {
			t.Errorf("old=%v: %v", old, got)
		}
	}
	good := ldCache(entries, false)
	bad := func(f func([]byte)) []byte { b := append([]byte(nil), good...); f(b); return b }
	for name, tc := range map[string]struct {
		data []byte
		off  int
	}{
		"no magic":        {[]byte("hello world, this is not a cache at all, really not."), 0},
		"short header":    {good[:30], 30},
		"huge count":      {bad(func(b []byte) { binary.LittleEndian.PutUint32(b[20:], 1<<30) }), 20},
		"string offset":   {bad(func(b []byte) { binary.LittleEndian.PutUint32(b[ldCacheNewHeader+4:], 1<<20) }), ldCacheNewHeader + 4},
		"unterminated":    {good[:len(good)-1], ldCacheNewHeader + ldCacheNewEntry + 8},
		"old count bogus": {append([]byte(ldCacheOldMagic+"\x00\xff\xff\xff\x7f"), make([]byte, 16)...), 12},
	} {
		_, err := parseLdCache(tc.data)
		var le *LdCacheError
		if !errors.As(err, &le) || le.Offset != tc.off {
			t.Errorf("%s: err %v, want an LdCacheError at byte %d", name, err, tc.off)
		}
	}
}

// TestParseSystemLdCache compares the parser with ldconfig's own listing.
func TestParseSystemLdCache(t *testing.T) {
	data, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		t.Skip("no /etc/ld.so.cache")
	}
	out, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		t.Skip("no ldconfig")
	}
	got, err := parseLdCache(data)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if name, path, ok := strings.Cut(strings.TrimSpace(line), " => "); ok {
			name, _, _ = strings.Cut(name, " (")
			found := false
			for _, e := range got {
				found = found || (e[0] == name && e[1] == path)
			}
			if !found {
				t.Errorf("ldconfig lists %s => %s; parser did not", name, path)
			}
			n++
		}
	}
	if n != len(got) {
		t.Errorf("ldconfig lists %d entries, parser %d", n, len(got))
	}
}

func FuzzParseLdCache(f *testing.F) {
	f.Add(ldCache([][2]string{{"libcuda.so.1", "/lib/libcuda.so.1"}}, false))
	f.Add(ldCache([][2]string{{"a", "b"}}, true))
	f.Add([]byte(ldCacheOldMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := parseLdCache(data)
		if err != nil {
			var le *LdCacheError
			if !errors.As(err, &le) || le.Offset < 0 || le.Offset > len(data) {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		for _, e := range entries {
			if strings.ContainsRune(e[0], 0) || strings.ContainsRune(e[1], 0) {
				t.Fatalf("NUL in %q", e)
			}
		}
	})
}

// TestDiscover checks every source on a fake proc root: extra paths, the
// ld.so.cache, search directories, a process in the same root, a process
// whose file is only reachable through its root, and a deleted mapping;
// duplicates by inode are listed once.
func TestDiscover(t *testing.T) {
	b := cudastub.ForTest(t)
	dir := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		copyLib(t, b.Lib, p)
		return p
	}
	extra := mk("extra/libcuda.so.1")
	cached := mk("cached/libcuda.so.1")
	searched := mk("search/libcuda.so.570.1")
	if err := os.Symlink("libcuda.so.570.1", filepath.Join(dir, "search/libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	mapped := mk("mapped/libcuda.so.1")
	inContainer := mk("proc/200/root/usr/lib/libcuda.so.1")
	deletedFile := mk("proc/300/map_files/7f00-7f10")

	cache := filepath.Join(dir, "ld.so.cache")
	if err := os.WriteFile(cache, ldCache([][2]string{{"libcuda.so.1", cached}, {"libc.so.6", "/lib/libc.so.6"}, {"libcuda.so", extra}}, false), 0o644); err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(dir, "proc")
	stat := func(p string) fileID {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return fileID{uint64(st.Dev), st.Ino}
	}
	maps := func(pid, path string, id fileID, suffix string) {
		maj, min := id.dev>>8&0xfff|id.dev>>32&^0xfff, id.dev&0xff|id.dev>>12&^0xff
		line := "7f00-7f10 r-xp 00000000 " + strconv.FormatUint(maj, 16) + ":" + strconv.FormatUint(min, 16) + " " + strconv.FormatUint(id.ino, 10) + " " + path + suffix + "\n"
		line += "7f10-7f20 r--p 00000000 00:00 0 [heap]\n"
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "maps"), []byte(line+line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	maps("100", mapped, stat(mapped), "")
	maps("101", extra, stat(extra), "") // a duplicate of an extra path
	maps("200", "/usr/lib/libcuda.so.1", stat(inContainer), "")
	maps("300", "/gone/libcuda.so.1", stat(deletedFile), " (deleted)")

	o := &Options{Libraries: []string{extra}, ProcRoot: proc, LdCache: cache, SearchDirs: []string{filepath.Join(dir, "search"), filepath.Join(dir, "absent")}}
	got, err, warn := discover(o)
	if err != nil || warn != nil {
		t.Fatal(err, warn)
	}
	// The search directory's symlink names the same file first (sorted);
	// mappings come in path order.
	_ = searched
	want := []string{extra, cached, filepath.Join(dir, "search/libcuda.so.1"), filepath.Join(proc, "300/map_files/7f00-7f10"), mapped, filepath.Join(proc, "200/root/usr/lib/libcuda.so.1")}
	var paths []string
	for _, c := range got {
		paths = append(paths, c.path)
		if c.id != stat(c.path) {
			t.Errorf("%s: id %v, stat says %v", c.path, c.id, stat(c.path))
		}
	}
	if strings.Join(paths, "\n") != strings.Join(want, "\n") {
		t.Errorf("discovered\n%s\nwant\n%s", strings.Join(paths, "\n"), strings.Join(want, "\n"))
	}

	o.Libraries = []string{filepath.Join(dir, "nope.so")}
	if _, err, _ := discover(o); err == nil || !strings.Contains(err.Error(), "nope.so") {
		t.Errorf("missing extra library: %v", err)
	}
	// A corrupt cache is reported apart, and the scan goes on (only the
	// cached entry is lost: the extra one is still mapped by pid 101).
	o.Libraries = nil
	if err := os.WriteFile(cache, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err, warn = discover(o)
	var le *LdCacheError
	if err != nil || !errors.As(warn, &le) || len(got) != len(want)-1 {
		t.Errorf("corrupt cache: %d found, err %v, warning %v", len(got), err, warn)
	}
}
