// Command etcdbin is etcd 3.6 built from the pinned go.etcd.io/etcd/server
// module, for test harnesses that start an "etcd" binary themselves
// (scheduler_perf serves it on a unix socket, which Debian's etcd 3.4
// rejects). testenv.BuildEtcd builds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
