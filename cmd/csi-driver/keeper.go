package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/pkg/logflags"
)

// runKeeper is `csi-driver fuse-keeper`: it holds copies of the streaming volumes' FUSE
// connections for the node plugin (pkg/fusekeeper), in a pod of its own that outlives the
// plugin's restarts and upgrades. It needs no privilege: only its socket's directory, which it
// keeps private to root (the socket trusts whoever reaches it).
func runKeeper(args []string) {
	fs := flag.NewFlagSet("fuse-keeper", flag.ExitOnError)
	logCfg := logflags.Register(fs)
	socket := fs.String("socket", "/var/lib/cistern/fuse-keeper/keeper.sock", "The keeper's unix socket; its directory is made private to the keeper's user (mode 0700).")
	_ = fs.Parse(args)
	if err := logflags.Apply(logCfg); err != nil {
		exit(err, "Invalid logging flags")
	}
	dir := filepath.Dir(*socket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		exit(err, "Cannot make the keeper's directory")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		exit(err, "Cannot make the keeper's directory private")
	}
	k, err := fusekeeper.Listen(*socket)
	if err != nil {
		exit(err, "Cannot listen", "socket", *socket)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	klog.InfoS("FUSE keeper serving", "version", version, "socket", *socket)
	if err := k.Serve(ctx); err != nil {
		exit(err, "FUSE keeper stopped with an error")
	}
	klog.InfoS("FUSE keeper stopped: the connections it held are let go", "held", k.Len())
}
