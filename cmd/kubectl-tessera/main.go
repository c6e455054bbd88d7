// Command kubectl-tessera is the kubectl plugin of Tessera (`kubectl
// tessera …` once on $PATH): the cluster's GPUs, GPU pods and why a GPU
// pod is pending, as the API server holds them, computed with the same
// code as the scheduler (internal/clusterview over the placement core).
// It takes kubectl's standard flags (cli-runtime): --kubeconfig,
// --context, -n, and -A and -o wide|json|yaml.
package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/clusterview"
)

func main() {
	cmd := newCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}

type options struct {
	flags         *genericclioptions.ConfigFlags
	allNamespaces bool
	output        string
	streams       genericiooptions.IOStreams
}

// newCommand is the plugin's command tree.
func newCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{flags: genericclioptions.NewConfigFlags(true), streams: streams}
	root := &cobra.Command{
		Use:           "kubectl-tessera",
		Short:         "Tessera's view of the cluster's GPUs",
		Long:          "Tessera's view of the cluster's GPUs: per GPU what is allocated and to whom (nodes), per GPU pod what it holds (pods), why a GPU pod is pending (why).\n`kubectl describe node` keeps Kubernetes' meaning (nvidia.com/gpu counts device-plugin slots, not GPUs); use `kubectl tessera nodes` for GPUs.",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.flags.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVarP(&o.output, "output", "o", "", "output format: wide, json or yaml")

	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "Per node and GPU: model, health, sharing mode, memory and cores allocated of the total, shares, pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := o.collect(cmd.Context())
			if err != nil {
				return err
			}
			return r.PrintNodes(o.streams.Out, o.output)
		},
	}
	pods := &cobra.Command{
		Use:   "pods",
		Short: "Per GPU pod and container: node, GPU, memory limit, core share (-A: every namespace)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := o.collect(cmd.Context())
			if err != nil {
				return err
			}
			ns := ""
			if !o.allNamespaces {
				if ns, err = o.namespace(); err != nil {
					return err
				}
			}
			return r.PrintPods(o.streams.Out, ns, o.output)
		},
	}
	pods.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "pods of every namespace")
	why := &cobra.Command{
		Use:   "why POD",
		Short: "Why a GPU pod is pending: per group of nodes, the reason and what to do, computed now",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := o.collect(cmd.Context())
			if err != nil {
				return err
			}
			ns, err := o.namespace()
			if err != nil {
				return err
			}
			w, err := r.Why(ns, args[0])
			if err != nil {
				return err
			}
			if o.output == clusterview.OutputJSON || o.output == clusterview.OutputYAML {
				return clusterview.Encode(o.streams.Out, o.output, w)
			}
			return w.Print(o.streams.Out)
		},
	}
	root.AddCommand(nodes, pods, why)
	return root
}

func (o *options) namespace() (string, error) {
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	return ns, err
}

func (o *options) collect(ctx context.Context) (*clusterview.Report, error) {
	if err := clusterview.CheckOutput(o.output); err != nil {
		return nil, err
	}
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return clusterview.Collect(ctx, client)
}
