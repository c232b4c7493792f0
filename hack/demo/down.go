package main

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/testutil"
)

// down stops the serving process (which stops its components and unmounts its pools), then
// releases whatever is still mounted or attached under the demo directory and removes it.
func down(d demoDir) error {
	if pid, ok := running(d); ok {
		fmt.Printf("Stopping the demo (pid %d)...\n", pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(90 * time.Second)
		for {
			if _, ok := running(d); !ok {
				break
			}
			if time.Now().After(deadline) {
				fmt.Println("still running after 90s; killing it")
				_ = syscall.Kill(pid, syscall.SIGKILL)
				time.Sleep(time.Second)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	} else {
		fmt.Println("The demo is not running.")
	}
	if _, err := os.Stat(string(d)); os.IsNotExist(err) {
		return nil
	}
	// Twice: a pool filesystem is only free once the volumes inside it are released.
	for range 2 {
		if err := cluster.ReleaseUnder(string(d)); err != nil {
			fmt.Println(err)
		}
	}
	loops := testutil.LoopDevicesUnder(string(d))
	if len(loops) > 0 {
		return fmt.Errorf("loop devices still attached: %v", loops)
	}
	if err := os.RemoveAll(string(d)); err != nil {
		return err
	}
	fmt.Printf("Removed %s; no mounts or loop devices left.\n", d)
	return nil
}
