package lab

// The scheduler and the node agents run under the identities a cluster
// gives them (package install): their ServiceAccounts with the RBAC
// shipped in deploy/, a token each, and the shipped admission policies
// installed, so that "only the scheduler writes records, only the agents
// write inventories" is enforced in the lab as in a cluster.

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/lab/labdir"
	"github.com/tessera-gpu/tessera/internal/lab/pki"
)

// Identities are the kubeconfigs of the components that do not run as the
// lab's admin.
type Identities struct {
	Scheduler, NodeAgent string
}

// setUpIdentities installs the identities and policies and writes a
// kubeconfig per identity.
func setUpIdentities(ctx context.Context, client kubernetes.Interface, d labdir.Dir, p pki.PKI, apiURL string) (Identities, error) {
	if err := install.Identities(ctx, client, false); err != nil {
		return Identities{}, err
	}
	ids := Identities{Scheduler: d.SchedulerKubeconfig(), NodeAgent: d.NodeAgentKubeconfig()}
	for _, x := range []struct{ sa, path string }{{install.SchedulerAccount, ids.Scheduler}, {install.NodeAgentAccount, ids.NodeAgent}} {
		token, err := install.Token(ctx, client, x.sa)
		if err != nil {
			return Identities{}, err
		}
		if err := p.WriteKubeconfigFor(x.path, apiURL, x.sa, token); err != nil {
			return Identities{}, err
		}
	}
	return ids, nil
}
