package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/preflight"
)

// runWaitReady waits until the release's DaemonSets run ready on every node
// they select: the chart's post-install and post-upgrade hook, so that
// helm install --wait --atomic fails (and rolls back) when the node agent
// cannot start on a GPU node, which helm's own --wait does not see.
func runWaitReady(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wait-ready", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster)")
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "the DaemonSets' namespace (default: $POD_NAMESPACE)")
	selector := fs.String("selector", "", "label selector of the DaemonSets to wait for (the release's: app.kubernetes.io/instance=NAME)")
	timeout := fs.Duration("timeout", 4*time.Minute, "how long to wait; keep it below helm's --timeout (5m by default)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tessera wait-ready --selector SELECTOR [flags]\n\nWaits until every DaemonSet matching SELECTOR runs its current template, ready, on every node it selects; on timeout names what keeps each pod from being ready and writes it as a TesseraNotReady event on the DaemonSet.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *selector == "" {
		return fmt.Errorf("%w: --selector is required", errUsage)
	}
	if *namespace == "" {
		return fmt.Errorf("%w: --namespace is required (or $POD_NAMESPACE)", errUsage)
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: --timeout %s: must be positive", errUsage, *timeout)
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := preflight.WaitRolledOut(ctx, client, *namespace, *selector, *timeout, 2*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "DaemonSets %s in %s: ready on every node\n", *selector, *namespace)
	return nil
}
