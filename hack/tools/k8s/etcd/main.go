// Command etcd is the etcd server, built from source at the version that k8s.io/kubernetes
// depends on, so the test control plane needs no downloaded release.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
