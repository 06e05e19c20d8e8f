// Command gpureport is the Go half of scripts/gpu-validate.sh: it reads
// what the tools of a section printed, writes the section's result lines
// (see package gpuvalidate) on standard output, and renders the results
// directory as Markdown. It ships in the validation bundle beside arbiter,
// so the GPU server needs no Go.
//
//	gpureport capture   -section S -events F -log F -program F [-pid N] [-exit N] [-prefix P]
//	gpureport probecost -section S -unprobed F -probed F
//	gpureport nvrm      -section S [-report F] [-log F]
//	gpureport channels  -section S -steps F -victim F -pid N
//	gpureport colocate  -section S -dir D
//	gpureport methods   < (arbiter channels suspend --help)
//	gpureport render    [-o F] DIR
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-arbiter/arbiter/internal/gpuvalidate"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "gpureport: %v\n", err)
		os.Exit(1)
	}
}

// usage is printed for a missing or unknown subcommand.
const usage = `usage: gpureport capture|probecost|nvrm|channels|colocate|methods|render [flags]
(see "gpureport SUBCOMMAND -h")`

// run runs one subcommand.
func run(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	fl := flag.NewFlagSet("gpureport "+args[0], flag.ContinueOnError)
	section := fl.String("section", args[0], "the section the result lines belong to")
	var w *gpuvalidate.Writer
	// writer returns the section's writer, once the flags are parsed.
	writer := func() *gpuvalidate.Writer {
		w = gpuvalidate.NewWriter(stdout, *section)
		return w
	}
	switch args[0] {
	case "capture":
		events := fl.String("events", "", "the trace's standard output (--format json)")
		log := fl.String("log", "", "the trace's standard error")
		program := fl.String("program", "", "the traced program's output (its calls: line)")
		pid := fl.Int("pid", 0, "count only this process's events")
		prefix := fl.String("prefix", "", "start the check and result names with this")
		exit := fl.Int("exit", -1, "the program's exit status, as its parent saw it")
		if err := parse(fl, args[1:], "events", "log", "program"); err != nil {
			return err
		}
		ev, err := os.Open(*events)
		if err != nil {
			return err
		}
		defer ev.Close()
		lg, err := os.Open(*log)
		if err != nil {
			return err
		}
		defer lg.Close()
		t, err := gpuvalidate.ParseTrace(ev, lg, *pid)
		if err != nil {
			return err
		}
		prog, err := workload(*program)
		if err != nil {
			return err
		}
		w = writer().WithPrefix(*prefix)
		gpuvalidate.WriteCapture(w, t, prog, *exit)
	case "probecost":
		unprobed := fl.String("unprobed", "", "the launch loop's output, untraced")
		probed := fl.String("probed", "", "the launch loop's output, traced")
		if err := parse(fl, args[1:], "unprobed", "probed"); err != nil {
			return err
		}
		u, err := workload(*unprobed)
		if err != nil {
			return err
		}
		p, err := workload(*probed)
		if err != nil {
			return err
		}
		gpuvalidate.WriteProbeCost(writer(), u, p)
	case "nvrm":
		report := fl.String("report", "", "the procedure's Markdown report (ARBITER_GPU_REPORT)")
		log := fl.String("log", "", "the log of nvrm.test -test.v")
		if err := parse(fl, args[1:]); err != nil {
			return err
		}
		rep, err := nvrmReport(*report, *log)
		if err != nil {
			return err
		}
		gpuvalidate.WriteNVRM(writer(), rep)
	case "channels":
		steps := fl.String("steps", "", "the section's command log")
		victim := fl.String("victim", "", "the victim's output")
		pid := fl.Int("pid", 0, "the victim's process id")
		if err := parse(fl, args[1:], "steps", "victim"); err != nil {
			return err
		}
		f, err := os.Open(*steps)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := gpuvalidate.ParseSteps(f)
		if err != nil {
			return err
		}
		v, err := os.Open(*victim)
		if err != nil {
			return err
		}
		defer v.Close()
		vic, err := gpuvalidate.ParseVictim(v)
		if err != nil {
			return err
		}
		gpuvalidate.WriteChannels(writer(), st, vic, *pid)
	case "colocate":
		dir := fl.String("dir", "", "the section's scenario directory")
		if err := parse(fl, args[1:], "dir"); err != nil {
			return err
		}
		sc, err := gpuvalidate.LoadScenarios(*dir)
		if err != nil {
			return err
		}
		gpuvalidate.WriteColocate(writer(), sc)
	case "methods":
		if err := parse(fl, args[1:]); err != nil {
			return err
		}
		b, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		for _, m := range gpuvalidate.SuspendMethods(string(b)) {
			fmt.Fprintln(stdout, m)
		}
		return nil
	case "render":
		out := fl.String("o", "", "write the Markdown here instead of standard output")
		if err := parse(fl, args[1:]); err != nil {
			return err
		}
		if fl.NArg() != 1 {
			return errors.New("render: name the results directory (holding results.txt)")
		}
		return render(fl.Arg(0), *out, stdout)
	default:
		return fmt.Errorf("unknown subcommand %q\n%s", args[0], usage)
	}
	if w == nil {
		return nil
	}
	return w.Err()
}

// parse parses flags and checks that the named ones are set.
func parse(fl *flag.FlagSet, args []string, required ...string) error {
	if err := fl.Parse(args); err != nil {
		return err
	}
	for _, name := range required {
		if fl.Lookup(name).Value.String() == "" {
			return fmt.Errorf("%s: -%s is required", fl.Name(), name)
		}
	}
	return nil
}

// workload parses a workload's output file.
func workload(path string) (gpuvalidate.Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return gpuvalidate.Workload{}, err
	}
	defer f.Close()
	return gpuvalidate.ParseWorkload(f)
}

// nvrmReport reads the procedure's report from its file where it wrote
// one, and the verdict from the test's log.
func nvrmReport(report, log string) (*gpuvalidate.NVRMReport, error) {
	var fromLog *gpuvalidate.NVRMReport
	if log != "" {
		f, err := os.Open(log)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if fromLog, err = gpuvalidate.ParseNVRMReport(f); err != nil {
			return nil, err
		}
	}
	if report != "" {
		b, err := os.ReadFile(report)
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		if len(strings.TrimSpace(string(b))) > 0 {
			rep, err := gpuvalidate.ParseNVRMReport(strings.NewReader(string(b)))
			if err != nil {
				return nil, err
			}
			if fromLog != nil {
				rep.Outcome, rep.Errors = fromLog.Outcome, fromLog.Errors
			}
			return rep, nil
		}
	}
	if fromLog == nil {
		return nil, errors.New("nvrm: give -report, -log or both")
	}
	return fromLog, nil
}

// render renders dir/results.txt to out, or to stdout where out is empty.
func render(dir, out string, stdout io.Writer) error {
	f, err := os.Open(filepath.Join(dir, "results.txt"))
	if err != nil {
		return fmt.Errorf("render: %w (is %s a results directory of gpu-validate.sh?)", err, dir)
	}
	defer f.Close()
	res, err := gpuvalidate.Parse(f)
	if err != nil {
		return err
	}
	opts := &gpuvalidate.RenderOptions{Files: os.DirFS(dir)}
	if out == "" {
		return gpuvalidate.Render(stdout, res, opts)
	}
	o, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	if err := gpuvalidate.Render(o, res, opts); err != nil {
		o.Close()
		return fmt.Errorf("render %s: %w", out, err)
	}
	return o.Close()
}
