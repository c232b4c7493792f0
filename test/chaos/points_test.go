package chaos

import (
	"bufio"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cistern-csi/cistern/pkg/testpoint"
)

// points is the test's end of the driver's test points (pkg/testpoint): the driver reports each
// point it reaches and waits for an answer. Every point is answered at once but an armed one,
// which is held unanswered, the call stopped there, until the test kills the driver.
type points struct {
	path string
	mu   sync.Mutex
	// armed are the points to hold at; the first of them reached is held, and disarms them.
	armed map[string]bool
	// held receives "point subject" when an armed point is reached.
	held    chan string
	holding []net.Conn
	reached map[string]int
}

func startPoints(t *testing.T, dir string) *points {
	p := &points{path: filepath.Join(dir, "points.sock"), held: make(chan string, 1), reached: map[string]int{}}
	ln, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); p.release() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.handle(c)
		}
	}()
	return p
}

func (p *points) env() string { return testpoint.EnvSocket + "=" + p.path }

func (p *points) handle(c net.Conn) {
	line, err := bufio.NewReader(c).ReadString('\n')
	line = strings.TrimSpace(line)
	point, _, _ := strings.Cut(line, " ")
	p.mu.Lock()
	p.reached[point]++
	hold := err == nil && p.armed[point]
	if hold {
		p.armed = nil
		p.holding = append(p.holding, c)
	}
	p.mu.Unlock()
	if hold {
		p.held <- line
		return
	}
	_, _ = c.Write([]byte("go\n"))
	c.Close()
}

// arm holds the next call that reaches one of names.
func (p *points) arm(names ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = map[string]bool{}
	for _, n := range names {
		p.armed[n] = true
	}
}

// disarm stops holding; a point held since (by work the call left running) is let go.
func (p *points) disarm() {
	p.mu.Lock()
	p.armed = nil
	p.mu.Unlock()
	select {
	case <-p.held:
	default:
	}
	p.release()
}

// release lets the held calls go on (or, once the driver is killed, drops their connections).
func (p *points) release() {
	p.mu.Lock()
	held := p.holding
	p.holding = nil
	p.mu.Unlock()
	for _, c := range held {
		_, _ = c.Write([]byte("go\n"))
		c.Close()
	}
}

// count is how many times the driver reached point.
func (p *points) count(point string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reached[point]
}
