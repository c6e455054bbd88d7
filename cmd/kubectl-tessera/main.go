// Command kubectl-tessera is the kubectl plugin of Tessera (`kubectl
// tessera …` once on $PATH): the cluster's GPUs, GPU pods and why a GPU
// pod is pending, as the API server holds them, computed with the same
// code as the scheduler (internal/clusterview over the placement core).
// It takes kubectl's standard flags (cli-runtime): --kubeconfig,
// --context, -n, and -A and -o wide|json|yaml.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
			client, err := o.client()
			if err != nil {
				return err
			}
			if err := r.Preemptions(cmd.Context(), client, w); err != nil {
				fmt.Fprintf(o.streams.ErrOut, "warning: preemption not shown: %v\n", err)
			}
			if o.output == clusterview.OutputJSON || o.output == clusterview.OutputYAML {
				return clusterview.Encode(o.streams.Out, o.output, w)
			}
			return w.Print(o.streams.Out)
		},
	}
	var agentNS, agentSelector string
	var agentPort int
	var metricsURLs []string
	top := &cobra.Command{
		Use:   "top",
		Short: "Per GPU container: GPU memory used vs its limit and SM use vs its share, from the node agents' metrics",
		Long: "Per GPU container: GPU memory used vs its limit and SM use vs its share, from the node agents' metrics, " +
			"read through the API server's pod proxy (--agent-namespace, --agent-selector, --agent-port) or from --metrics-url.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := clusterview.CheckOutput(o.output); err != nil {
				return err
			}
			ctx := cmd.Context()
			var rows []clusterview.TopRow
			add := func(body io.Reader, from string) error {
				r, err := clusterview.ParseTop(body)
				if err != nil {
					return fmt.Errorf("%s: %w", from, err)
				}
				rows = append(rows, r...)
				return nil
			}
			if len(metricsURLs) > 0 {
				for _, u := range metricsURLs {
					req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
					if err != nil {
						return err
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return err
					}
					err = add(resp.Body, u)
					resp.Body.Close()
					if err != nil {
						return err
					}
				}
			} else {
				client, err := o.client()
				if err != nil {
					return err
				}
				agents, err := client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
				if err != nil {
					return err
				}
				if len(agents.Items) == 0 {
					return fmt.Errorf("no node agent pods in namespace %s with labels %s (--agent-namespace, --agent-selector)", agentNS, agentSelector)
				}
				for _, a := range agents.Items {
					if a.Status.Phase != corev1.PodRunning {
						fmt.Fprintf(o.streams.ErrOut, "node agent %s on %s is %s; its node is left out\n", a.Name, a.Spec.NodeName, a.Status.Phase)
						continue
					}
					b, err := client.CoreV1().Pods(agentNS).ProxyGet("http", a.Name, strconv.Itoa(agentPort), "metrics", nil).DoRaw(ctx)
					if err != nil {
						fmt.Fprintf(o.streams.ErrOut, "node agent %s on %s: %v; its node is left out\n", a.Name, a.Spec.NodeName, err)
						continue
					}
					if err := add(bytes.NewReader(b), a.Name); err != nil {
						return err
					}
				}
			}
			ns := ""
			if !o.allNamespaces {
				var err error
				if ns, err = o.namespace(); err != nil {
					return err
				}
			}
			return clusterview.PrintTop(o.streams.Out, rows, ns, o.output)
		},
	}
	top.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "containers of every namespace")
	top.Flags().StringVar(&agentNS, "agent-namespace", "tessera-system", "namespace of the node agent pods")
	top.Flags().StringVar(&agentSelector, "agent-selector", "app=tessera-node-agent", "label selector of the node agent pods")
	top.Flags().IntVar(&agentPort, "agent-port", 9402, "the node agents' metrics port")
	top.Flags().StringArrayVar(&metricsURLs, "metrics-url", nil, "read these node agent /metrics URLs instead (repeatable)")
	root.AddCommand(nodes, pods, why, top)
	return root
}

func (o *options) client() (kubernetes.Interface, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
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
	r, err := clusterview.Collect(ctx, client)
	if err == nil && r.DRA != nil {
		fmt.Fprintf(o.streams.ErrOut, "warning: DRA claims not shown: %v\n", r.DRA)
	}
	return r, err
}
