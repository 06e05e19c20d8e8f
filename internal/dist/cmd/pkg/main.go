// Command pkg builds Arbiter's .deb and .rpm packages (make dist):
//
//	pkg -root . -version v1.2.0 -out dist -bin amd64=dist/arbiter-linux-amd64 -bin arm64=dist/arbiter-linux-arm64
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/gpu-arbiter/arbiter/internal/dist"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "pkg:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("pkg", flag.ContinueOnError)
	o := dist.Options{Binaries: map[string]string{}}
	fs.StringVar(&o.Root, "root", ".", "repository root")
	fs.StringVar(&o.Description, "description", "", "nfpm package description (default ROOT/deploy/nfpm.yaml)")
	fs.StringVar(&o.Version, "version", "", "version, as git describe --tags prints it")
	fs.StringVar(&o.Out, "out", "dist", "output directory")
	formats := fs.String("formats", strings.Join(dist.Formats, ","), "package formats, comma-separated")
	fs.Func("bin", "ARCH=PATH of a binary to package (repeat per architecture)", func(s string) error {
		arch, path, ok := strings.Cut(s, "=")
		if !ok || arch == "" || path == "" {
			return fmt.Errorf("%q is not ARCH=PATH", s)
		}
		o.Binaries[arch] = path
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Formats = strings.Split(*formats, ",")
	paths, err := dist.Build(o)
	if err != nil {
		return err
	}
	for _, p := range paths {
		fmt.Println(p)
	}
	return nil
}
