package streamfs

import (
	"bufio"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// openLog records, in the scratch directory, what the kernel may still hold of this mount's
// opens when another process takes it over: the backing files registered (by ID) and the files
// opened without passthrough. Lines of "<node ID> <backing ID>": 0 for an open without
// passthrough, minus the ID for a registration dropped (the bound, backing.go). A node's last
// line is what holds. The lines grow with every registration and drop, so once they are many
// more than what holds, the log is written again with what holds alone.
//
// A process of an earlier version taking over reads a node's first backing ID and ignores the
// rest: it would answer a file whose registration was dropped with an ID gone (EIO at open).
type openLog struct {
	mu   sync.Mutex
	f    *os.File
	root *os.Root // the scratch directory, held by the mount
	// held is what the lines say holds, by node ID; lines is how many the file has.
	held          map[uint64]int32
	lines         int
	noPassthrough atomic.Bool
}

const openLogName = ".opens"

// compactSlack is how many lines beyond twice what holds the log may have before it is written
// again: a rewrite costs a line per node held, so this many records pay for one.
const compactSlack = 4096

func newOpenLog(scratch *os.Root) (*openLog, error) {
	f, err := scratch.OpenFile(openLogName, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &openLog{f: f, root: scratch, held: map[uint64]int32{}}, nil
}

func resumeOpenLog(scratch *os.Root) (*openLog, error) {
	f, err := scratch.OpenFile(openLogName, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	l := &openLog{f: f, root: scratch, held: map[uint64]int32{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var id uint64
		var bid int32
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &id, &bid); err != nil {
			continue // a line cut short by the old process's end: nothing was answered after it
		}
		l.lines++
		l.note(id, bid)
	}
	if err := sc.Err(); err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

// note applies one line to held.
func (l *openLog) note(id uint64, bid int32) {
	switch {
	case bid >= 0:
		l.held[id] = bid
	case l.held[id] == -bid:
		delete(l.held, id)
	}
}

// apply gives the files what an earlier process left: a file it answered without passthrough
// is never passed through (it may still be open so), and its registrations are kept for the
// life of the mount (which of their opens are still held, no one can tell).
func (l *openLog) apply(t *tree, m *mount) {
	for id, bid := range l.held {
		n := t.get(id)
		switch {
		case n == nil || n.file == nil:
		case bid == 0:
			n.file.inherited = true
		default:
			n.file.backing = m.cfg.Files.pin(bid)
			m.trackBacking(n.file.backing)
		}
	}
}

// record appends one line; the write reaches the page cache before the kernel hears the answer,
// which is all a later process on this node needs.
func (l *openLog) record(id uint64, bid int32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return os.ErrClosed
	}
	if _, err := fmt.Fprintf(l.f, "%d %d\n", id, bid); err != nil {
		return err
	}
	l.lines++
	l.note(id, bid)
	if l.lines > 2*len(l.held)+compactSlack {
		if err := l.compactLocked(); err != nil {
			// The lines still say what holds: only longer.
			klog.Background().Error(err, "streaming volume: writing the opens log again", "scratch", l.root.Name())
		}
	}
	return nil
}

// compactLocked writes what holds to a new file that replaces the log at once: a process taking
// over reads the one or the other, which say the same.
func (l *openLog) compactLocked() error {
	tmp := openLogName + ".new"
	f, err := l.root.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for id, bid := range l.held {
		fmt.Fprintf(w, "%d %d\n", id, bid)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := l.root.Rename(tmp, openLogName); err != nil {
		f.Close()
		return err
	}
	l.f.Close()
	l.f, l.lines = f, len(l.held)
	return nil
}

func (l *openLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
