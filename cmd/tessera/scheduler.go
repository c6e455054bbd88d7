package main

import (
	"context"
	"io"
	"slices"

	"github.com/tessera-gpu/tessera/internal/scheduler"
)

// runScheduler runs kube-scheduler with the Tessera plugin; the arguments
// are kube-scheduler's (see deploy/scheduler/config.yaml).
func runScheduler(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if !slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "--help" || a == "--version" }) {
		if err := schedulerPreflight(ctx, args); err != nil {
			return err
		}
	}
	cmd := scheduler.NewCommand()
	cmd.Use = "tessera scheduler"
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	return cmd.ExecuteContext(ctx)
}
