package testpeers

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/cistern-csi/cistern/test/framework/kit"
)

// daemon is a peer process started outside any one test (a TestMain's, shared by a package):
// in its own process group, killed with SIGKILL if the test binary dies, its output in a log.
type daemon struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
	stopOnce  sync.Once
}

// startDaemon runs bin with args, output appended to logPath.
func startDaemon(name, logPath, bin string, args ...string) (*daemon, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own copy
	fmt.Fprintf(log, "+ %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := kit.StartGroup(cmd); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	d := &daemon{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// exited reports whether the daemon has ended.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the daemon's group, waits up to 10s, then kills the group.
func (d *daemon) stop() {
	d.stopOnce.Do(func() {
		kit.StopGroup(d.name, d.cmd.Process.Pid, d.done, 10*time.Second)
	})
}
