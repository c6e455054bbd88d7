// Package etcd starts an embedded single-member etcd 3.6, from the pinned
// go.etcd.io/etcd/server module, inside the calling process: the emulated
// cluster's store (tessera-lab runs it in its supervisor), and the one the
// test harness (internal/testenv) starts for tests.
package etcd

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Start starts etcd with its data in dir, on free loopback ports, and
// returns its client URL and a function that stops it.
func Start(dir string) (clientURL string, stop func(), err error) {
	clientPort, err := freePort()
	if err != nil {
		return "", nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	// Shutting down logs harmless "server closed" errors; keep them with
	// the data rather than on the caller's output.
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Tests and demos create and delete thousands of objects; keep the
	// history short.
	cfg.AutoCompactionMode = "revision"
	cfg.AutoCompactionRetention = "1000"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		e.Close()
		return "", nil, fmt.Errorf("etcd not ready within a minute")
	}
	return cu.String(), e.Close, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
