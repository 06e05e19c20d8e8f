package uprobe

import (
	"os"
	"path/filepath"
	"strings"
)

// FoundLibrary is one distinct libcuda file on the node, as Discover finds
// it.
type FoundLibrary struct {
	// Path is the path it is reached through: for a library seen only
	// inside a container, a /proc/PID/root/... path; for a deleted one
	// still mapped by a process, its /proc/PID/map_files entry.
	Path string
	// Dev and Inode identify the file.
	Dev, Inode uint64
	// Version is the driver version the file's name carries, following
	// symbolic links (libcuda.so.1 -> libcuda.so.550.54.15 gives
	// "550.54.15"); empty where no name in the chain carries one.
	Version string
	// Source says how it was found: "/etc/ld.so.cache", "directory
	// /usr/lib64", "maps of pid 1234" or "Options.Libraries".
	Source string
}

// Discover finds every distinct libcuda file that Open would attach now,
// as its scan does (Options.Libraries, the dynamic linker's cache, the
// library directories and every process's mappings, inside containers
// too), without loading or attaching anything. It needs no privilege,
// but finds the libraries of other users' processes only as root (or with
// CAP_SYS_PTRACE, which reading their /proc/PID/maps takes). The error
// names a path of Options.Libraries that cannot be used; trouble with one
// process or one directory is skipped, as Open's scan skips it.
func Discover(opts *Options) ([]FoundLibrary, error) {
	o := opts.withDefaults()
	cands, err, _ := discover(&o)
	out := make([]FoundLibrary, len(cands))
	for i, c := range cands {
		out[i] = FoundLibrary{Path: c.path, Dev: c.id.dev, Inode: c.id.ino, Version: libraryVersion(o.ProcRoot, c.path), Source: c.source}
	}
	return out, err
}

// maxLinks bounds the symbolic links libraryVersion follows.
const maxLinks = 8

// libraryVersion returns the version carried by the name of path or of a
// link target on the way to the file, e.g. "550.54.15" for
// libcuda.so.550.54.15. An absolute link target under a procRoot/PID/root
// path is resolved inside that root, as the process sees it.
func libraryVersion(procRoot, path string) string {
	root := containerRoot(procRoot, path)
	for range maxLinks {
		if v := versionSuffix(filepath.Base(path)); v != "" {
			return v
		}
		target, err := os.Readlink(path)
		if err != nil {
			return ""
		}
		if filepath.IsAbs(target) {
			path = filepath.Join(root, target)
		} else {
			path = filepath.Join(filepath.Dir(path), target)
		}
	}
	return ""
}

// versionSuffix returns what follows "libcuda.so." in name where it is a
// dotted version of at least two numbers ("1", the soname's, is not a
// driver version).
func versionSuffix(name string) string {
	v, ok := strings.CutPrefix(name, "libcuda.so.")
	if !ok {
		return ""
	}
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return ""
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return ""
		}
	}
	return v
}

// containerRoot returns the procRoot/PID/root prefix of path, "/" where
// it has none.
func containerRoot(procRoot, path string) string {
	rest, ok := strings.CutPrefix(path, filepath.Clean(procRoot)+"/")
	if !ok {
		return "/"
	}
	pid, rest, _ := strings.Cut(rest, "/")
	if pid == "" || strings.Trim(pid, "0123456789") != "" || (rest != "root" && !strings.HasPrefix(rest, "root/")) {
		return "/"
	}
	return filepath.Join(procRoot, pid, "root")
}

// DefaultSearchDirs returns the library directories Open and Discover
// search where Options.SearchDirs is nil, so that a caller can look in the
// same places under another root (a host's filesystem mounted in a
// container).
func DefaultSearchDirs() []string {
	return append([]string(nil), defaultSearchDirs...)
}
