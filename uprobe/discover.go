package uprobe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpu-arbiter/arbiter/procfs"
)

// defaultSearchDirs are searched for libcuda.so* besides ld.so.cache: where
// distributions and the NVIDIA installers put the driver library.
var defaultSearchDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
	"/usr/lib64", "/usr/lib", "/lib64", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
	"/usr/local/nvidia/lib64", "/usr/local/cuda/compat",
}

// sourceExtra marks a candidate named in Options.Libraries.
const sourceExtra = "Options.Libraries"

// fileID identifies a library file independently of the path it is reached
// through.
type fileID struct{ dev, ino uint64 }

// candidate is one library file found by discovery.
type candidate struct {
	id   fileID
	path string
	// source says how it was found, for error messages.
	source string
}

// isLibcuda reports whether a file name is the driver library (libcuda.so,
// libcuda.so.1, libcuda.so.550.54.15), not libcudart or libcudnn.
func isLibcuda(path string) bool {
	base := filepath.Base(path)
	return base == "libcuda.so" || strings.HasPrefix(base, "libcuda.so.")
}

// discover returns every distinct libcuda file reachable now: the extra
// paths, the ld.so.cache entries, the search directories, and every file
// mapped by a process (through /proc/PID/root so that files inside other
// mount namespaces are found, or /proc/PID/map_files for deleted ones).
// Files are de-duplicated by (device, inode); the first path found wins. Errors about single entries (a process
// that exited mid-scan) are ignored; an extra path that cannot be read is
// reported: as the first error when it is an extra path, as the second
// (the scan went on without it) otherwise.
func discover(o *Options) (cands []candidate, explicit, other error) {
	seen := map[fileID]bool{}
	var out []candidate
	add := func(path, source string) error {
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return err
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			return fmt.Errorf("%s is not a regular file", path)
		}
		id := fileID{uint64(st.Dev), st.Ino}
		if !seen[id] {
			seen[id] = true
			out = append(out, candidate{id: id, path: path, source: source})
		}
		return nil
	}
	var errs, warns []error
	for _, p := range o.Libraries {
		if err := add(p, sourceExtra); err != nil {
			errs = append(errs, fmt.Errorf("library %s: %w", p, err))
		}
	}
	if o.LdCache != "-" {
		if data, err := os.ReadFile(o.LdCache); err == nil {
			entries, err := parseLdCache(data)
			if err != nil {
				warns = append(warns, fmt.Errorf("%s: %w", o.LdCache, err))
			}
			for _, e := range entries {
				if isLibcuda(e[0]) {
					_ = add(e[1], o.LdCache)
				}
			}
		}
	}
	for _, dir := range o.SearchDirs {
		matches, _ := filepath.Glob(filepath.Join(dir, "libcuda.so*"))
		for _, m := range matches {
			_ = add(m, "directory "+dir)
		}
	}
	for _, m := range mappedLibraries(o.ProcRoot) {
		if c, ok := mappingCandidate(o.ProcRoot, m); ok && !seen[c.id] {
			seen[c.id] = true
			out = append(out, c)
		}
	}
	return out, errors.Join(errs...), errors.Join(warns...)
}

// mappingCandidate returns the path through which a mapped file is opened:
// its plain path where that names the same file here (a process in the
// tracer's mount namespace; it reads better), else the path through the
// process's root (a container), or its map_files entry when it was deleted
// (a driver upgrade replaced it under a running process).
func mappingCandidate(procRoot string, m mapping) (candidate, bool) {
	source := "maps of pid " + m.pid
	pid, _ := strconv.Atoi(m.pid)
	paths := []string{m.path, procfs.At(procRoot).Root(pid, m.path)}
	if m.deleted {
		paths = []string{m.mapFile}
	}
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			continue
		}
		id := fileID{uint64(st.Dev), st.Ino}
		if id != (fileID{m.dev, m.ino}) {
			continue
		}
		return candidate{id: id, path: p, source: source}, true
	}
	return candidate{}, false
}

// mapping is one libcuda file mapped by a process.
type mapping struct {
	pid, path, mapFile string
	dev, ino           uint64
	// start, end and pgoff are the mapped address range and the file
	// offset it starts at.
	start, end, pgoff uint64
	deleted           bool
}

// newMapping is m, a mapping of process pid read from proc.
func newMapping(proc *procfs.FS, pid int, m procfs.Mapping) mapping {
	return mapping{pid: strconv.Itoa(pid), path: m.Path, mapFile: proc.MapFile(pid, m), dev: m.Dev, ino: m.Inode,
		start: m.Start, end: m.End, pgoff: m.Offset, deleted: m.Deleted}
}

// mappedLibraries scans procRoot/*/maps for libcuda mappings, one per file
// per process.
func mappedLibraries(procRoot string) []mapping {
	proc := procfs.At(procRoot)
	pids, err := proc.PIDs()
	if err != nil {
		return nil
	}
	var out []mapping
	for _, pid := range pids {
		out = append(out, mappingsOf(proc, pid)...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}

// processMappings returns the libcuda files process pid maps, one mapping
// each; none when it is gone.
func processMappings(procRoot, pid string) []mapping {
	n, err := strconv.Atoi(pid)
	if err != nil {
		return nil
	}
	return mappingsOf(procfs.At(procRoot), n)
}

func mappingsOf(proc *procfs.FS, pid int) []mapping {
	var out []mapping
	seen := map[fileID]bool{}
	_ = proc.Maps(pid, func(m procfs.Mapping) bool {
		if id := (fileID{m.Dev, m.Inode}); isLibcuda(m.Path) && !seen[id] {
			seen[id] = true
			out = append(out, newMapping(proc, pid, m))
		}
		return true
	})
	return out
}

// mappingAt returns the file mapping of process pid that holds address addr.
func mappingAt(procRoot, pid string, addr uint64) (mapping, bool) {
	n, err := strconv.Atoi(pid)
	if err != nil {
		return mapping{}, false
	}
	proc := procfs.At(procRoot)
	var found *procfs.Mapping
	_ = proc.Maps(n, func(m procfs.Mapping) bool {
		if m.Start <= addr && addr < m.End {
			found = &m
		}
		return found == nil
	})
	if found == nil {
		return mapping{}, false
	}
	return newMapping(proc, n, *found), true
}
