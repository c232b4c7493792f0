// Command pause is the sandbox ("pause") container of the node-level tests: it holds the pod's
// namespaces, reaps orphans when it is PID 1 of a shared PID namespace, and exits on SIGTERM or
// SIGINT, as the upstream pause image does. A static Go binary, so the image needs no libc.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
