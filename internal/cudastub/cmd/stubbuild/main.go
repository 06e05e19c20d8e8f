// Command stubbuild builds the stub CUDA driver (libcuda.so.1) and its
// workload programs (infer, train) into a directory, for the demo and for
// running the workloads by hand:
//
//	go run ./internal/cudastub/cmd/stubbuild -out bin/stub
//	LD_LIBRARY_PATH=bin/stub bin/stub/infer --rate 200 --duration 10
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
)

func main() {
	out := flag.String("out", "bin/stub", "directory to build into")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: stubbuild [-out DIR]")
		os.Exit(2)
	}
	b, err := cudastub.BuildAt(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stubbuild:", err)
		os.Exit(1)
	}
	fmt.Printf("stub CUDA driver: %s\nworkloads: %s %s\n", b.Lib, b.Infer, b.Train)
}
