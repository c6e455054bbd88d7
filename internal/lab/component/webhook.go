package component

import (
	"context"
	"flag"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// WebhookArgs runs the webhook under kubeconfig, serving on listen.
func WebhookArgs(kubeconfig, listen string) []string {
	return Args(Webhook, "--kubeconfig="+kubeconfig, "--listen="+listen)
}

func runWebhook(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(Webhook, flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	client, err := Client(*kubeconfig)
	if err != nil {
		return err
	}
	return webhook.Run(ctx, webhook.Options{
		Client: client, Names: api.DefaultResourceNames, SchedulerName: api.SchedulerName,
		Listen: *listen, Hosts: []string{"127.0.0.1"},
		// A CA kept in a Secret: a restarted webhook keeps its trust.
		CASecretNamespace: install.Namespace, CASecretName: "tessera-webhook-ca",
		Register: true, Registration: webhook.Registration{Name: "tessera-webhook", ExcludeNamespaces: []string{"kube-system", install.Namespace}},
	})
}
