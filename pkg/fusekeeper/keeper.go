// Package fusekeeper keeps copies of FUSE connections' /dev/fuse descriptors in a process of its
// own, so that a connection outlives the process serving it: the kernel keeps a FUSE mount
// alive while any copy of its descriptor is open, and the requests meanwhile wait. The server
// hands its descriptor over (Keep) when it mounts; after a restart it takes the descriptors back
// (Take) and serves them again; it drops one (Drop) when it unmounts for good. List names what
// the keeper holds, so that a server hands a keeper that started again what it lacks.
//
// The keeper answers on a unix socket (SOCK_SEQPACKET, descriptors passed with SCM_RIGHTS). It
// trusts every client that can reach the socket: the socket must be private to the server.
package fusekeeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Held is one connection the keeper holds.
type Held struct {
	// ID names the connection (a volume ID, say).
	ID string `json:"id"`
	// Meta is what the server needs besides the descriptor to serve it again.
	Meta []byte `json:"meta,omitempty"`
	// Dev is the descriptor; nil in the keeper's answers before it is attached.
	Dev *os.File `json:"-"`
}

type message struct {
	Op string `json:"op,omitempty"` // keep, take, drop, list
	Held
	Error string `json:"error,omitempty"`
	End   bool   `json:"end,omitempty"`
}

// MaxMeta bounds the metadata of one connection the keeper holds (a server's record of a few
// KiB: its INIT request, its caller's credentials); a keep with more is refused. With the
// server's bound on its connections (the plugin's --streaming-max-volumes), it bounds the
// keeper's memory: a keeper run out of it would start again empty, be handed every connection
// again, and run out again.
const MaxMeta = 16 << 10

// maxMessage bounds a message: an ID, and metadata of at most MaxMeta (base64 in JSON).
const maxMessage = MaxMeta*4/3 + 4<<10

// Keeper holds descriptors until they are dropped or it ends.
type Keeper struct {
	l    *net.UnixListener
	mu   sync.Mutex
	held map[string]Held
}

// Listen makes the keeper's socket at path (mode 0600, in a directory that must be private too:
// the mode is set just after the socket is made; a stale socket there is replaced).
func Listen(path string) (*Keeper, error) {
	_ = os.Remove(path)
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return &Keeper{l: l, held: map[string]Held{}}, nil
}

// Serve answers clients until ctx ends, then closes every descriptor it holds: a keeper that
// ends lets its connections go with their servers.
func (k *Keeper) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		k.l.Close()
	}()
	defer k.closeAll()
	for {
		c, err := k.l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go k.answer(c)
	}
}

// Path is the keeper's socket.
func (k *Keeper) Path() string { return k.l.Addr().String() }

// Len is how many connections the keeper holds.
func (k *Keeper) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.held)
}

func (k *Keeper) closeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, h := range k.held {
		h.Dev.Close()
		delete(k.held, id)
	}
}

func (k *Keeper) answer(c *net.UnixConn) {
	defer c.Close()
	req, dev, err := receive(c)
	if err != nil {
		klog.Background().Error(err, "FUSE keeper: a bad request")
		return
	}
	switch req.Op {
	case "keep":
		if dev == nil {
			_ = send(c, message{Error: "keep: no descriptor"}, nil)
			return
		}
		if len(req.Meta) > MaxMeta {
			dev.Close()
			_ = send(c, message{Error: fmt.Sprintf("keep: %d bytes of metadata, more than %d", len(req.Meta), MaxMeta)}, nil)
			return
		}
		k.mu.Lock()
		if old, ok := k.held[req.ID]; ok {
			old.Dev.Close()
		}
		k.held[req.ID] = Held{ID: req.ID, Meta: req.Meta, Dev: dev}
		k.mu.Unlock()
		_ = send(c, message{End: true}, nil)
	case "drop":
		k.mu.Lock()
		if old, ok := k.held[req.ID]; ok {
			old.Dev.Close()
			delete(k.held, req.ID)
		}
		k.mu.Unlock()
		_ = send(c, message{End: true}, nil)
	case "take":
		// Copies go out; the keeper keeps its own until the server drops them. The copies are
		// made under the lock: a drop, or the keeper's end, may close the originals meanwhile
		// (and the number be reused for another file).
		all, err := k.copies()
		defer func() {
			for _, h := range all {
				h.Dev.Close()
			}
		}()
		if err != nil {
			_ = send(c, message{Error: "take: " + err.Error()}, nil)
			return
		}
		for _, h := range all {
			if err := send(c, message{Held: Held{ID: h.ID, Meta: h.Meta}}, h.Dev); err != nil {
				return
			}
		}
		_ = send(c, message{End: true}, nil)
	case "list":
		k.mu.Lock()
		ids := make([]string, 0, len(k.held))
		for id := range k.held {
			ids = append(ids, id)
		}
		k.mu.Unlock()
		for _, id := range ids {
			if err := send(c, message{Held: Held{ID: id}}, nil); err != nil {
				return
			}
		}
		_ = send(c, message{End: true}, nil)
	default:
		_ = send(c, message{Error: fmt.Sprintf("unknown request %q", req.Op)}, nil)
	}
}

// copies duplicates every descriptor held; the caller closes the copies.
func (k *Keeper) copies() ([]Held, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	all := make([]Held, 0, len(k.held))
	for _, h := range k.held {
		fd, err := unix.FcntlInt(h.Dev.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, c := range all {
				c.Dev.Close()
			}
			return nil, fmt.Errorf("copying %s's descriptor: %w", h.ID, err)
		}
		all = append(all, Held{ID: h.ID, Meta: h.Meta, Dev: os.NewFile(uintptr(fd), h.Dev.Name())})
	}
	return all, nil
}

func send(c *net.UnixConn, m message, dev *os.File) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if dev != nil {
		oob = unix.UnixRights(int(dev.Fd()))
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

func receive(c *net.UnixConn) (message, *os.File, error) {
	b, oob := make([]byte, maxMessage), make([]byte, unix.CmsgSpace(4))
	n, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return message{}, nil, err
	}
	if flags&unix.MSG_TRUNC != 0 {
		// Cut at the buffer: refused whole rather than parsed from a part.
		err = fmt.Errorf("a message of more than %d bytes", maxMessage)
	}
	var dev *os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return message{}, nil, err
		}
		for _, cm := range msgs {
			fds, err := unix.ParseUnixRights(&cm)
			if err != nil {
				continue
			}
			for i, fd := range fds {
				unix.CloseOnExec(fd)
				if i == 0 && dev == nil {
					dev = os.NewFile(uintptr(fd), "/dev/fuse")
				} else {
					unix.Close(fd)
				}
			}
		}
	}
	var m message
	if err == nil {
		err = json.Unmarshal(b[:n], &m)
	}
	if err != nil {
		if dev != nil {
			dev.Close()
		}
		return message{}, nil, err
	}
	return m, dev, nil
}

func dial(path string) (*net.UnixConn, error) {
	return net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
}

// call sends one request and reads answers until the end, each with its descriptor.
func call(path string, req message, dev *os.File) ([]Held, error) {
	return exchange(path, req, dev, true)
}

// exchange is call; withDev false: answers carry no descriptor (List).
func exchange(path string, req message, dev *os.File, withDev bool) ([]Held, error) {
	c, err := dial(path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := send(c, req, dev); err != nil {
		return nil, err
	}
	var out []Held
	for {
		m, d, err := receive(c)
		if err != nil {
			for _, h := range out {
				h.Dev.Close()
			}
			return nil, fmt.Errorf("FUSE keeper at %s: %w", path, err)
		}
		switch {
		case m.Error != "":
			return nil, fmt.Errorf("FUSE keeper at %s: %s", path, m.Error)
		case m.End:
			return out, nil
		case d == nil && withDev:
			return nil, errors.New("FUSE keeper: an answer without its descriptor")
		case d != nil && !withDev:
			d.Close()
			d = nil
		}
		out = append(out, Held{ID: m.ID, Meta: m.Meta, Dev: d})
	}
}

// Keep hands the keeper at path a copy of dev (the caller keeps its own) with meta, under id;
// meta of more than MaxMeta bytes is refused.
func Keep(path, id string, dev *os.File, meta []byte) error {
	if len(meta) > MaxMeta {
		return fmt.Errorf("FUSE keeper: %d bytes of metadata for %s, more than %d", len(meta), id, MaxMeta)
	}
	_, err := call(path, message{Op: "keep", Held: Held{ID: id, Meta: meta}}, dev)
	return err
}

// Take returns copies of every descriptor the keeper at path holds; the caller closes them.
func Take(path string) ([]Held, error) {
	return call(path, message{Op: "take"}, nil)
}

// List names the connections the keeper at path holds.
func List(path string) ([]string, error) {
	held, err := exchange(path, message{Op: "list"}, nil, false)
	ids := make([]string, 0, len(held))
	for _, h := range held {
		ids = append(ids, h.ID)
	}
	return ids, err
}

// Drop closes the keeper's copy of id (nothing if it holds none).
func Drop(path, id string) error {
	_, err := call(path, message{Op: "drop", Held: Held{ID: id}}, nil)
	return err
}
