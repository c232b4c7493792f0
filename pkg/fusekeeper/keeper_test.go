package fusekeeper_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/fusekeeper"
)

// TestKeepTakeDrop: a descriptor handed to the keeper stays open after the client closes its
// own, comes back (with its metadata) to a later client, and is closed once dropped.
func TestKeepTakeDrop(t *testing.T) {
	k, err := fusekeeper.Listen(filepath.Join(t.TempDir(), "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	if info, err := os.Stat(k.Path()); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v, %v; want mode 0600", info, err)
	}

	// A pipe stands in for /dev/fuse: its reader sees EOF only once every copy of the write
	// end is closed.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := fusekeeper.Keep(k.Path(), "vol-1", w, []byte(`{"init":"x"}`)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	held, err := fusekeeper.Take(k.Path())
	if err != nil || len(held) != 1 || held[0].ID != "vol-1" || string(held[0].Meta) != `{"init":"x"}` {
		t.Fatalf("take: %+v, %v", held, err)
	}
	if _, err := held[0].Dev.Write([]byte("a")); err != nil {
		t.Fatalf("writing through the copy taken back: %v", err)
	}
	held[0].Dev.Close()
	b := make([]byte, 1)
	if n, err := r.Read(b); n != 1 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	if k.Len() != 1 {
		t.Fatalf("keeper holds %d after take, want 1 (take hands out copies)", k.Len())
	}
	if ids, err := fusekeeper.List(k.Path()); err != nil || len(ids) != 1 || ids[0] != "vol-1" {
		t.Fatalf("list: %v, %v; want [vol-1]", ids, err)
	}
	if err := fusekeeper.Drop(k.Path(), "vol-1"); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Read(b); n != 0 || err == nil {
		t.Fatalf("after drop: read %d, %v; want EOF (the keeper's copy closed)", n, err)
	}
	if held, err := fusekeeper.Take(k.Path()); err != nil || len(held) != 0 {
		t.Fatalf("take after drop: %+v, %v", held, err)
	}
	if ids, err := fusekeeper.List(k.Path()); err != nil || len(ids) != 0 {
		t.Fatalf("list after drop: %v, %v", ids, err)
	}
}

// TestKeeperBoundsMeta: a connection's metadata past MaxMeta is refused, by Keep and by the
// keeper itself (from a client that does not check), and so is a message past the keeper's
// buffer, which is not parsed from the part that fits: the keeper holds nothing of either, and
// its descriptor is closed.
func TestKeeperBoundsMeta(t *testing.T) {
	k, err := fusekeeper.Listen(filepath.Join(t.TempDir(), "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := fusekeeper.Keep(k.Path(), "big", w, make([]byte, fusekeeper.MaxMeta+1)); err == nil {
		t.Error("Keep took metadata past MaxMeta")
	}
	// A client sending what Keep would not: the keeper refuses it.
	for _, n := range []int{fusekeeper.MaxMeta + 1, 96 << 10} {
		msg, _ := json.Marshal(map[string]any{"op": "keep", "id": "big", "meta": make([]byte, n)})
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: k.Path(), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(int(w.Fd())), nil); err != nil {
			t.Fatalf("%d bytes of metadata: %v", n, err)
		}
		b := make([]byte, 1<<10)
		n2, _ := c.Read(b)
		c.Close()
		if k.Len() != 0 {
			t.Fatalf("%d bytes of metadata: the keeper holds %d, answered %q", n, k.Len(), b[:n2])
		}
		if n == fusekeeper.MaxMeta+1 && !strings.Contains(string(b[:n2]), "more than") {
			t.Errorf("%d bytes of metadata: answered %q, want a refusal", n, b[:n2])
		}
	}
	// The keeper closed every copy it was sent: the pipe's reader sees EOF once ours goes.
	w.Close()
	if n, err := r.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read %d, %v; want EOF (the keeper kept a copy)", n, err)
	}
	if err := fusekeeper.Keep(k.Path(), "small", r, make([]byte, fusekeeper.MaxMeta)); err != nil || k.Len() != 1 {
		t.Fatalf("metadata of MaxMeta bytes: %v, %d held", err, k.Len())
	}
}
