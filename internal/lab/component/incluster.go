package component

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// InCluster runs another program as if it ran in a pod of the cluster
// (`tessera-lab component in-cluster --token FILE --ca FILE --server URL
// -- PROGRAM ARGS…`): in this process's own mount namespace (the
// supervisor starts it with CLONE_NEWNS) a tmpfs over /run holds the
// ServiceAccount files client-go's in-cluster configuration reads
// (/var/run/secrets/kubernetes.io/serviceaccount/token and ca.crt), the
// environment names the API server (KUBERNETES_SERVICE_HOST and _PORT),
// and the program replaces this process. Volcano's scheduler needs it:
// its device plugins (deviceshare's vGPU handshake) reach the API server
// through the in-cluster configuration whatever --kubeconfig says.
const InCluster = "in-cluster"

// serviceAccountDir is where client-go's rest.InClusterConfig reads the
// token and the CA (/var/run is /run).
const serviceAccountDir = "/run/secrets/kubernetes.io/serviceaccount"

func runInCluster(args []string) error {
	fs := flag.NewFlagSet(InCluster, flag.ContinueOnError)
	token := fs.String("token", "", "file holding the ServiceAccount's token")
	ca := fs.String("ca", "", "the API server's CA certificate")
	server := fs.String("server", "", "the API server, https://HOST:PORT")
	if err := fs.Parse(args); err != nil {
		return err
	}
	prog := fs.Args()
	if len(prog) == 0 || *token == "" || *ca == "" || *server == "" {
		return errors.New("usage: in-cluster --token FILE --ca FILE --server https://HOST:PORT -- PROGRAM [ARGS…]")
	}
	host, port, ok := strings.Cut(strings.TrimPrefix(*server, "https://"), ":")
	if !ok {
		return fmt.Errorf("--server %q: want https://HOST:PORT", *server)
	}
	files := map[string][]byte{}
	for name, src := range map[string]string{"token": *token, "ca.crt": *ca} {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		files[name] = b
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private (in-cluster needs its own mount namespace): %w", err)
	}
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", 0, "size=1m"); err != nil {
		return fmt.Errorf("a tmpfs over /run: %w", err)
	}
	if err := os.MkdirAll(serviceAccountDir, 0o755); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(serviceAccountDir, name), b, 0o600); err != nil {
			return err
		}
	}
	env := append(os.Environ(), "KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port)
	return syscall.Exec(prog[0], prog, env)
}
