// Command etcd runs the etcd server from go.etcd.io/etcd/server/v3, pinned by this module.
//
// The etcd root module (which holds etcd's own main package) is not importable as a
// dependency, so this wrapper calls the same entry point, etcdmain.Main.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
