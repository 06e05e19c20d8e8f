// Package procfs reads the per-process files of procfs: /proc/PID/stat,
// status, comm, exe, cmdline, cgroup, environ, maps and root. It is the
// one reader of those files in Arbiter; the mechanisms (uprobe, nvrm), the
// policy input builder and the commands all go through it.
//
// An [FS] reads under a configurable root: "/" on a host, the host's root
// mounted into a container (a DaemonSet's /host), or a temporary tree in
// tests. [At] names a procfs mount directly.
//
// A process is known by its pid and its start time ([Stat].StartTime,
// clock ticks since boot): a pid can be reused, a pid and start time
// cannot ([Key]). [FS.StartTime] reads only that, cheaply enough for
// every traced event that needs it.
//
// Every failed read is an [*Error] naming the pid and the file. A process
// that exited, or never existed, is errors.Is(err, [ErrGone]); a file the
// caller may not read is errors.Is(err, fs.ErrPermission), and the message
// names the capability that would allow it.
//
// The package depends on the standard library and golang.org/x/sys only,
// so every other package may import it.
package procfs
