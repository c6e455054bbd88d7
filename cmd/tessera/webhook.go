package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/webhook"
	"github.com/tessera-gpu/tessera/pkg/api"
)

// runWebhook serves Tessera's admission webhook (see docs/webhook.md).
func runWebhook(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	listen := fs.String("listen", ":8443", "TLS listen address")
	prefix := fs.String("resource-prefix", api.DefaultResourcePrefix, "prefix of the GPU resource names")
	schedulerName := fs.String("scheduler-name", api.SchedulerName, "scheduler that GPU pods are sent to")
	namespace := fs.String("namespace", "tessera-system", "namespace of the webhook's Service and CA Secret")
	service := fs.String("service-name", "tessera-webhook", "name of the webhook's Service")
	port := fs.Int("service-port", 443, "port of the webhook's Service")
	configName := fs.String("configuration-name", "tessera-webhook", "name of the Mutating/ValidatingWebhookConfiguration written at start-up")
	caSecret := fs.String("ca-secret", "tessera-webhook-ca", "Secret holding the CA shared by replicas (empty: a fresh CA per start)")
	exclude := fs.String("exclude-namespaces", "tessera-system", "comma-separated namespaces never sent to the webhook, besides kube-system")
	register := fs.Bool("register", true, "write the webhook configurations with the CA at start-up (false with cert-manager)")
	schedulerUsers := fs.String("scheduler-users", webhook.DefaultSchedulerUser, "comma-separated identities (request.userInfo.username) that may write allocation records")
	trusted := fs.String("trusted-namespaces", "", "comma-separated namespaces exempt from the isolation checks (hostPID, privileged, capabilities, hostPath); \"*\" exempts every namespace; namespaces labelled "+webhook.TrustedLabel+"=true are exempt too")
	allowEnvFrom := fs.Bool("allow-unprefixed-env-from", false, "the same as --unprefixed-env-from=allow (kept for existing installations)")
	deviceList := fs.String("device-list-strategy", string(api.DeviceListEnvvar), "the node agents' --device-list-strategy: under envvar a pod's environment selects GPUs, so the variables that select devices are refused (and kept out of pods that ask for no GPU); cdi-cri and volume-mounts need the NVIDIA runtime to ignore the environment of unprivileged containers (docs/security.md)")
	envFrom := fs.String("unprefixed-env-from", string(webhook.EnvFromAuto), "envFrom without a prefix in GPU pods: auto (admitted where the environment selects no device: --device-list-strategy cdi-cri or volume-mounts), allow or refuse")
	audit := fs.Bool("audit", false, "audit mode: admit pods with isolation findings (host namespaces, privileged, device-selecting variables, mounts over the limiter's files, …) with admission warnings, an event and a metric instead of refusing them; quantities the scheduler cannot honour and record writes are still refused (docs/security.md)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: webhook takes no positional arguments, got %q", errUsage, fs.Args())
	}
	names, err := api.NewResourceNames(*prefix)
	if err != nil {
		return fmt.Errorf("%w: --resource-prefix: %v", errUsage, err)
	}
	strategy := api.DeviceListStrategy(*deviceList)
	if !slices.Contains(api.DeviceListStrategies(), strategy) {
		return fmt.Errorf("%w: --device-list-strategy %q: want one of %v", errUsage, *deviceList, api.DeviceListStrategies())
	}
	rule := webhook.EnvFromRule(*envFrom)
	if !slices.Contains(webhook.EnvFromRules(), rule) {
		return fmt.Errorf("%w: --unprefixed-env-from %q: want one of %v", errUsage, *envFrom, webhook.EnvFromRules())
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	excluded := splitList(*exclude)
	users := splitList(*schedulerUsers)
	if len(users) == 0 {
		return fmt.Errorf("%w: --scheduler-users is empty: nobody could write allocation records", errUsage)
	}
	return webhook.Run(ctx, webhook.Options{
		Client:            client,
		Names:             names,
		SchedulerName:     *schedulerName,
		Listen:            *listen,
		Hosts:             webhook.ServiceHosts(*service, *namespace),
		CASecretNamespace: *namespace,
		CASecretName:      *caSecret,
		Register:          *register,
		Registration: webhook.Registration{
			Name:              *configName,
			ServiceNamespace:  *namespace,
			ServiceName:       *service,
			ServicePort:       int32(*port),
			ExcludeNamespaces: excluded,
		},
		SchedulerUsers:         users,
		TrustedNamespaces:      splitList(*trusted),
		AllowUnprefixedEnvFrom: *allowEnvFrom,
		DeviceListStrategy:     strategy,
		UnprefixedEnvFrom:      rule,
		Audit:                  *audit,
	})
}

// splitList splits a comma-separated flag, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
