package framework_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework"
)

func TestStartProcess(t *testing.T) {
	t.Parallel()
	// The child of the shell records its pid, so we can check that Stop reaches the whole group.
	pidFile := t.TempDir() + "/child.pid"
	p := framework.StartProcess(t, "sh", "/bin/sh", "-c", `echo hello from sh; sleep 1000 & echo $! > `+pidFile+`; wait`)

	var childPid int
	framework.Eventually(t, 10*time.Second, "the child's pid", func(context.Context) error {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			return err
		}
		childPid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err
	})
	log, err := os.ReadFile(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "hello from sh") {
		t.Errorf("log %s does not hold the output; got:\n%s", p.LogPath, log)
	}

	p.Stop()
	select {
	case <-p.Done():
	default:
		t.Fatal("Stop returned before the process exited")
	}
	// The orphaned child is reaped by init some time after it dies; until then it is a zombie.
	framework.Eventually(t, 30*time.Second, "the child gone", func(context.Context) error {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", childPid))
		if errors.Is(err, os.ErrNotExist) || strings.Contains(string(stat), ") Z ") {
			return nil
		}
		return fmt.Errorf("pid %d still runs: %s", childPid, stat)
	})
}

// TestProcessWaitListening: WaitListening returns once the address accepts connections, and
// fails at once, naming the exit and the log, when the process exits first.
func TestProcessWaitListening(t *testing.T) {
	t.Parallel()
	p := framework.StartProcess(t, "listening", "/bin/sh", "-c", "sleep 1000")
	addr := framework.FreeAddr(t)
	listener := make(chan net.Listener, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		l, _ := net.Listen("tcp", addr) // on an error, WaitListening times out and the test fails
		listener <- l
	}()
	err := p.WaitListening(addr, time.Minute)
	if l := <-listener; l != nil {
		l.Close()
	}
	if err != nil {
		t.Fatal(err)
	}

	exits := framework.StartProcess(t, "exits", "/bin/sh", "-c", "echo giving up; exit 3")
	start := time.Now()
	err = exits.WaitListening(framework.FreeAddr(t), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "giving up") {
		t.Errorf("a process that exits: %v", err)
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("WaitListening took %s to see the exit", time.Since(start))
	}
}

func TestExternalProvisioner(t *testing.T) {
	t.Parallel()
	// csi-provisioner prints its version and exits, which shows the binary runs.
	p := framework.StartProcess(t, "csi-provisioner", framework.ExternalProvisioner(t), "--version")
	<-p.Done()
	if err := p.Err(); err != nil {
		t.Fatalf("csi-provisioner --version: %v", err)
	}
	if log, _ := os.ReadFile(p.LogPath); !strings.Contains(string(log), "v6.4.0") {
		t.Errorf("csi-provisioner --version printed:\n%s", log)
	}
}
