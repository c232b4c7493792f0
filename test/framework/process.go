package framework

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cistern-csi/cistern/test/framework/kit"
)

// stopGracePeriod is how long a process may take to exit after SIGTERM before it is killed.
const stopGracePeriod = 10 * time.Second

// Process is a command started by StartProcess: its own process group, its output in a log file.
type Process struct {
	// Name identifies the process in logs and errors.
	Name string
	// LogPath is the file receiving its stdout and stderr.
	LogPath string

	cmd      *exec.Cmd
	done     chan struct{}
	err      error
	stopOnce sync.Once
	stopped  atomic.Bool
}

// StartProcess starts bin with args, writing its output to <LogDir>/<name>.log, and stops it
// (with its whole process group) when the test ends.
func StartProcess(t TB, name, bin string, args ...string) *Process {
	t.Helper()
	return StartCommand(t, name, exec.Command(bin, args...))
}

// StartCommand is StartProcess for a prepared command, e.g. one with Env or Dir set. Stdout,
// Stderr and SysProcAttr are set by StartCommand.
func StartCommand(t TB, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	p, err := startProcess(LogDir(t), name, cmd)
	if err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() {
		select {
		case <-p.done:
			if !p.stopped.Load() {
				t.Logf("%s had exited before the end of the test: %v (log: %s)", name, p.err, p.LogPath)
			}
		default:
		}
		p.Stop() // also reaps what the process left behind in its group
	})
	return p
}

func startProcess(logDir, name string, cmd *exec.Cmd) (*Process, error) {
	logPath := filepath.Join(logDir, name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own copy
	fmt.Fprintf(log, "+ %s\n", strings.Join(cmd.Args, " "))
	cmd.Stdout, cmd.Stderr = log, log
	// Own process group, so Stop reaches the children too; SIGKILL if the test binary dies.
	cmd.SysProcAttr = nil
	if err := kit.StartGroup(cmd); err != nil {
		return nil, err
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Pid is the process's id (also its process group's).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Err is the exit error once Done is closed (nil for exit status 0).
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// WaitListening is kit.WaitListening for this process: it gives up as soon as the process exits,
// and its error carries the end of the process's log.
func (p *Process) WaitListening(addr string, timeout time.Duration) error {
	err := kit.WaitListening(addr, timeout, p.done)
	if errors.Is(err, kit.ErrExited) {
		err = fmt.Errorf("%w (%v)", err, p.Err())
	}
	if err != nil {
		return fmt.Errorf("%s: %w; last lines of %s:\n%s", p.Name, err, p.LogPath, Tail(p.LogPath, 20))
	}
	return nil
}

// Stop sends SIGTERM to the process group, waits up to 10s, then kills the group. Safe to call
// more than once.
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		p.stopped.Store(true)
		kit.StopGroup(p.Name, p.cmd.Process.Pid, p.done, stopGracePeriod)
	})
}
