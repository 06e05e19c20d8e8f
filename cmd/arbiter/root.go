package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// newRootCmd builds the arbiter command tree. Each subcommand has a
// constructor of its own, in a file of its own.
func newRootCmd(version string) *cobra.Command {
	root := &cobra.Command{
		Use:   "arbiter",
		Short: "GPU SLO scheduler: eBPF CUDA tracing, Rego policies, driver channel control",
		Long: `Arbiter lets latency-critical GPU work (inference) meet its SLOs on GPUs
shared with best-effort work (training, batch), with no change to the
applications or the driver.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version, // --version, as the version command prints it
	}
	root.SetVersionTemplate("arbiter {{.Version}}\n")
	root.AddCommand(
		newVersionCmd(version),
		newSimCmd(),
		newTraceCmd(),
		newPolicyCmd(),
		newChannelsCmd(),
		newRecoverCmd(),
		newDoctorCmd(),
		newRunCmd(),
		newPsCmd(),
		newStatusCmd(),
	)
	root.InitDefaultCompletionCmd()
	usageErrors(root)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if !c.HasParent() {
			return usageErrorf("%w\n%s", err, rootUsage)
		}
		return usageErrorf("%w\nusage: %s", err, c.UseLine())
	})
	return root
}

// usageError is a command used wrongly (unknown command or flag, wrong
// arguments, a required flag missing, a flag value it does not take):
// exit status 2, as with other command-line tools, where a command that
// ran and failed exits 1.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// ExitCode implements exitCoder.
func (e *usageError) ExitCode() int { return 2 }

// usageErrorf formats a usageError as fmt.Errorf does.
func usageErrorf(format string, a ...any) error { return &usageError{fmt.Errorf(format, a...)} }

// rootUsage is the usage line of the root command, which only holds
// commands.
const rootUsage = "usage: arbiter COMMAND (arbiter --help lists them)"

// ownUsageErrors is the annotation of a command that words its own
// argument errors (the channels family, see reportErrors).
const ownUsageErrors = "arbiter.own-usage-errors"

// usageErrors makes every command below c name its usage line when given
// the wrong arguments, and makes a command group (one that only holds
// commands) refuse a command it does not have, where cobra would print the
// group's help and exit 0 as if asked for it. Commands that wrap their own
// argument errors (annotated ownUsageErrors) are left as they are.
func usageErrors(c *cobra.Command) {
	for _, sub := range c.Commands() {
		usageErrors(sub)
	}
	if !c.HasParent() || c.Annotations[ownUsageErrors] != "" {
		return
	}
	if !c.Runnable() {
		if !c.HasSubCommands() {
			return
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return usageErrorf("%s: unknown command %q%s\nusage: %s COMMAND (%s --help lists them)",
				cmd.CommandPath(), args[0], didYouMean(cmd, args[0]), cmd.CommandPath(), cmd.CommandPath())
		}
		return
	}
	validate := c.Args
	if validate == nil {
		validate = cobra.ArbitraryArgs
	}
	c.Args = func(cmd *cobra.Command, args []string) error {
		err := validate(cmd, args)
		if err == nil {
			// Checked here too, before cobra does, to name the usage.
			err = cmd.ValidateRequiredFlags()
		}
		if err == nil {
			return nil
		}
		if strings.Contains(err.Error(), cmd.CommandPath()) {
			return usageErrorf("%w\nusage: %s", err, cmd.UseLine())
		}
		return usageErrorf("%s: %w\nusage: %s", cmd.CommandPath(), err, cmd.UseLine())
	}
}

// newVersionCmd prints the build version.
func newVersionCmd(version string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the arbiter version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "arbiter", version)
			return err
		},
	}
}

// didYouMean suggests c's commands whose names are close to arg: ", did
// you mean list?"; "" where none is.
func didYouMean(c *cobra.Command, arg string) string {
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2 // cobra's own default, set only on its root path
	}
	if s := c.SuggestionsFor(arg); len(s) > 0 {
		return ", did you mean " + strings.Join(s, " or ") + "?"
	}
	return ""
}
