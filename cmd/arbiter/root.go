package main

import (
	"fmt"

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
	}
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
	return root
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
