package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// entries holds entries 0-9 of the test version, entry i being i+1 copies of "<i>:"; entry
// 7 is not held, entry 8 fails as the node reads it, and entry 9 ends early.
type entries struct {
	// opened, when set, hears of each entry opened; gate, when set, must let entry 2 be opened.
	opened chan int64
	gate   chan struct{}
}

func content(i int64) string { return strings.Repeat(fmt.Sprintf("%d:", i), int(i)+1) }

func (e *entries) Versions(id string) []string { return store{}.Versions(id) }

func (e *entries) Have(id, digest string) (*Have, bool) {
	var bits []byte
	for i := range int64(10) {
		if i != 7 {
			bits = SetEntry(bits, i)
		}
	}
	return &Have{Entries: bits}, id == testID && digest == testDigest
}

func (e *entries) Open(id, digest string, i, off, n int64) (io.ReadCloser, error) {
	if e.opened != nil {
		e.opened <- i
	}
	if i == 2 && e.gate != nil {
		<-e.gate
	}
	c := content(i)
	switch {
	case id != testID || digest != testDigest || i == 7 || i > 9 || off+n > int64(len(c)):
		return nil, ErrNotHeld
	case i == 8:
		return nil, errors.New("disk error")
	case i == 9:
		return io.NopCloser(strings.NewReader(c[off : off+n/2])), nil
	}
	return io.NopCloser(strings.NewReader(c[off : off+n])), nil
}

func whole(i int64) Range { return Range{Index: i, N: int64(len(content(i)))} }

// TestBatch: many pieces in one request, each framed, in the order asked; pieces the node does
// not hold (or cannot read) are marked and the rest still comes; a piece cut short ends the
// answer with an error.
func TestBatch(t *testing.T) {
	p := serveWith(t, ServerConfig{Store: &entries{}})
	n := client(t, "node-plugin")
	ctx := context.Background()

	h, err := n.HaveOf(ctx, p, testID, testDigest)
	if err != nil || h.Batch != MaxBatchPieces {
		t.Fatalf("have: %+v, %v; want batches of up to %d", h, err, MaxBatchPieces)
	}

	pieces := []Range{whole(3), whole(7), {Index: 5, Off: 2, N: 4}, whole(8), whole(0), whole(1), whole(9), whole(4)}
	b, err := n.OpenBatch(ctx, p, testID, testDigest, pieces)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for k, want := range []string{content(3), "", content(5)[2:6], "", content(0), content(1)} {
		r, held, err := b.Next()
		if err != nil {
			t.Fatalf("piece %d: %v", k, err)
		}
		if held != (want != "") {
			t.Fatalf("piece %d: held %v, want %q", k, held, want)
		}
		if !held || k == 4 {
			continue // entry 0 is left unread: Next skips it
		}
		if got, err := io.ReadAll(r); err != nil || string(got) != want {
			t.Fatalf("piece %d: %q, %v; want %q", k, got, err, want)
		}
	}
	// Entry 9 is cut short: its reader ends early, and the batch with it.
	r, held, err := b.Next()
	if err != nil || !held {
		t.Fatalf("entry 9: %v %v", held, err)
	}
	if got, _ := io.ReadAll(r); len(got) >= len(content(9)) {
		t.Fatalf("entry 9: got all %d bytes of a piece cut short", len(got))
	}
	if _, _, err := b.Next(); err == nil || err == io.EOF {
		t.Fatalf("after a piece cut short: %v, want an error", err)
	}

	b, err = n.OpenBatch(ctx, p, testID, testDigest, []Range{whole(6)})
	if err != nil {
		t.Fatal(err)
	}
	if r, held, err := b.Next(); err != nil || !held {
		t.Fatalf("entry 6: %v %v", held, err)
	} else if got, _ := io.ReadAll(r); string(got) != content(6) {
		t.Fatalf("entry 6: %q", got)
	}
	if _, _, err := b.Next(); err != io.EOF {
		t.Fatalf("after the last piece: %v, want EOF", err)
	}
	b.Close()

	for _, tc := range []struct {
		name   string
		pieces []Range
	}{
		{"no pieces", nil},
		{"too many pieces", make([]Range, MaxBatchPieces+1)},
		{"empty piece", []Range{{Index: 1, N: 0}}},
		{"negative offset", []Range{{Index: 1, Off: -1, N: 2}}},
		{"too many bytes", []Range{{Index: 1, N: MaxBatchBytes}, {Index: 2, N: 1}}},
	} {
		t.Run("failure case - "+tc.name, func(t *testing.T) {
			if _, err := n.OpenBatch(ctx, p, testID, testDigest, tc.pieces); err == nil {
				t.Fatal("the client sent it")
			}
			// The server refuses it too, whoever sends it.
			body, _ := json.Marshal(batchRequest{Pieces: tc.pieces})
			resp, err := n.do(ctx, p, http.MethodPost, batchPath(testID, testDigest), body)
			if err == nil {
				resp.Body.Close()
			}
			if !isStatus(err, http.StatusBadRequest) {
				t.Fatalf("got %v, want 400", err)
			}
		})
	}
	t.Run("failure case - not JSON", func(t *testing.T) {
		_, err := n.do(ctx, p, http.MethodPost, batchPath(testID, testDigest), bytes.Repeat([]byte("["), 100))
		if !isStatus(err, http.StatusBadRequest) {
			t.Fatalf("got %v, want 400", err)
		}
	})
}

// TestBatchTakesOneSlot: a batch holds one upload slot while it is sent, whatever its pieces:
// with one slot, a piece asked meanwhile is refused, and served once the batch is done.
func TestBatchTakesOneSlot(t *testing.T) {
	e := &entries{opened: make(chan int64, 16), gate: make(chan struct{})}
	p := serveWith(t, ServerConfig{Store: e, MaxUploads: 1, QueueWait: 1})
	n := client(t, "node-plugin")
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		b, err := n.OpenBatch(ctx, p, testID, testDigest, []Range{whole(1), whole(2), whole(3)})
		if err != nil {
			done <- err
			return
		}
		defer b.Close()
		for range 3 {
			r, held, err := b.Next()
			if err != nil || !held {
				done <- fmt.Errorf("%v %v", held, err)
				return
			}
			io.Copy(io.Discard, r)
		}
		done <- nil
	}()
	for i := int64(-1); i != 2; {
		select {
		case i = <-e.opened:
		case err := <-done:
			t.Fatalf("the batch ended before entry 2: %v", err)
		}
	}
	if _, err := n.OpenPiece(ctx, p, testID, testDigest, 4, 0, 2); !IsBusy(err) {
		t.Fatalf("a piece asked while the batch holds the only slot: %v, want busy", err)
	}
	close(e.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The handler gives its slot back just after the batch's last byte.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rc, err := n.OpenPiece(ctx, p, testID, testDigest, 4, 0, 2)
		if err == nil {
			rc.Close()
			return
		}
		if !IsBusy(err) || time.Now().After(deadline) {
			t.Fatalf("after the batch: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
