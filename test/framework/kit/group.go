package kit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// StartGroup starts cmd in a process group of its own, so that StopGroup reaches its children
// too, and has the kernel SIGKILL it when the test binary dies.
func StartGroup(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pdeathsig = true, syscall.SIGKILL
	return spawn(cmd)
}

// StopGroup sends SIGTERM to the process group of pid (started by StartGroup), waits up to grace
// for done (closed when the leader is reaped), then kills the group: children that outlived the
// leader, or a leader that ignored SIGTERM. It returns once done is closed.
func StopGroup(name string, pid int, done <-chan struct{}, grace time.Duration) {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		fmt.Fprintf(os.Stderr, "killing process group of %s: %v\n", name, err)
	}
	<-done
}

// Children get Pdeathsig when the *thread* that forked them exits, not the process. Forking from
// one goroutine locked to a thread that never exits makes it mean "when the test binary dies".
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for req := range spawnReqs {
				req.err <- req.cmd.Start()
			}
		}()
	})
	req := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnReqs <- req
	return <-req.err
}
