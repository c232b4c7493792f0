package stage

// Reads: one range of an entry copied into its temporary file, retried with backoff where it
// stopped, its digest computed as the bytes stream.

import (
	"context"
	"errors"
	"hash"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

const copyBufSize = 1 << 20

var bufPool = sync.Pool{New: func() any { b := alignedBuf(copyBufSize); return &b }}

// readInto copies [off, off+n) of o into f at off, retrying transient failures with exponential
// backoff and full jitter, resuming where the last attempt stopped. A full read of an object that
// comes with a full-object checksum is checked against it (checked names its algorithm);
// otherwise, when newHash is set, the range's digest is returned for the caller to check. With pr, peers may serve the
// bytes (peers.go); pr records which did.
func (j *Job) readInto(ctx context.Context, o source.Object, f *output, off, n int64, newHash func() hash.Hash, pr *pieceRead) (checked string, sum []byte, err error) {
	r := &rangeRead{o: o, f: f, off: off, n: n, newHash: newHash, pr: pr}
	for attempt := 0; ; {
		actx, cancel := context.WithTimeoutCause(ctx, j.e.cfg.Limits.ReadTimeout(n-r.written), errTooSlow)
		via, err := j.readOnce(actx, r)
		cancel()
		if err == nil {
			return j.checkRead(r)
		}
		if ctx.Err() != nil {
			return "", nil, context.Cause(ctx)
		}
		if via != nil {
			// A peer that fails, is slow or goes away costs no retry: the next read goes to
			// another peer or the source (the peer is left alone a while).
			klog.FromContext(ctx).V(2).Info("peer read failed", "key", o.Key, "peer", via.Node, "err", err)
			continue
		}
		if errors.Is(context.Cause(actx), errTooSlow) {
			err = source.Wrap(source.Retryable, errTooSlow, "%q", o.Key)
		}
		if attempt++; source.KindOf(err) != source.Retryable || attempt >= j.e.cfg.Retries {
			j.bytesDone.Add(-r.written)
			return "", nil, err
		}
		j.e.cfg.Metrics.Retries.Inc()
		klog.FromContext(ctx).V(2).Info("retrying read", "key", o.Key, "attempt", attempt+1, "err", err)
		if err := sleepBackoff(ctx, attempt); err != nil {
			j.bytesDone.Add(-r.written)
			return "", nil, err
		}
	}
}

// rangeRead is one readInto across its attempts: [off, off+n) of o into f, written so far, and
// the digest of what was written.
type rangeRead struct {
	o       source.Object
	f       *output
	off, n  int64
	newHash func() hash.Hash
	pr      *pieceRead
	written int64
	h       hash.Hash
	want    source.Checksum
}

// readOnce is one attempt of r: from a peer (via) or the source, from where the last attempt
// stopped.
func (j *Job) readOnce(ctx context.Context, r *rangeRead) (via *peer.Peer, err error) {
	rc, via, err := j.open(ctx, r.pr, r.o, r.off+r.written, r.n-r.written)
	if err != nil {
		return via, err
	}
	piece := peer.Range{Index: -1}
	if via == nil && j.peers.shared() && r.pr != nil {
		// Peers that need this piece wait for it rather than read it from the source too.
		piece = peer.Range{Index: r.pr.i, Off: r.off + r.written, N: r.n - r.written}
		j.peers.holding.SetBusy(piece, true)
	}
	if r.written == 0 {
		// A resumed read continues the same digest: reads are pinned to the listed version, so
		// the rest of the bytes belong to the checksum of the first.
		r.want, r.h = source.Checksum{}, nil
		if c, ok := rc.(source.Checksummed); ok {
			if nh := checksumHash(c.Checksum().Algorithm); nh != nil {
				r.want, r.h = c.Checksum(), nh()
			}
		}
		if r.h == nil && r.newHash != nil {
			r.h = r.newHash()
		}
	}
	k, err := j.copyAt(ctx, r.f, r.off+r.written, r.n-r.written, rc, r.h)
	r.written += k
	rc.Close()
	if piece.Index >= 0 {
		j.peers.holding.SetBusy(piece, false)
	}
	origin := OriginSource
	if via != nil {
		origin = OriginPeer
		j.peers.sw().Done(*via, err != nil || k < r.n-(r.written-k))
	}
	j.e.cfg.Metrics.Fetched.WithLabelValues(j.id, origin).Add(float64(k))
	if err == nil && r.written < r.n {
		err = source.Errorf(source.Retryable, "%q: short read (%d of %d bytes)", r.o.Key, r.written, r.n)
	}
	return via, err
}

// checkRead checks a complete read against the full-object checksum the source sent with it
// (checked names its algorithm), or returns the digest for the caller to check.
func (j *Job) checkRead(r *rangeRead) (checked string, sum []byte, err error) {
	switch {
	case r.want.Algorithm != "":
		if got := encodeChecksum(r.h.Sum(nil)); got != r.want.Value {
			j.bytesDone.Add(-r.written)
			return "", nil, source.Errorf(source.Corrupt, "%q: %s checksum %s does not match %s",
				r.o.Key, r.want.Algorithm, got, r.want.Value)
		}
		return strings.ToLower(r.want.Algorithm), nil, nil
	case r.h != nil:
		return "", r.h.Sum(nil), nil
	}
	return "", nil, nil
}

func sleepBackoff(ctx context.Context, attempt int) error {
	d := min(200*time.Millisecond<<attempt, 10*time.Second)
	d = time.Duration(rand.Int64N(int64(d)) + 1) // full jitter
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// copyAt copies up to n bytes from r to f at off, honouring the node's bandwidth limit, and
// counts progress. A copy of more than one buffer reads the next buffer while the last one is
// written and hashed (copyPipelined).
func (j *Job) copyAt(ctx context.Context, f *output, off, n int64, r io.Reader, h hash.Hash) (int64, error) {
	if n > copyBufSize {
		return j.copyPipelined(ctx, f, off, n, r, h)
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var done int64
	for done < n {
		want := min(int64(len(buf)), n-done)
		k, rerr := io.ReadFull(r, buf[:want])
		w, k := f.chunk(buf[:want], k, off+done)
		if k > 0 {
			if err := j.writeChunk(ctx, f, buf, w, k, off+done, h); err != nil {
				return done, err
			}
			done += int64(k)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return done, nil
		}
		if rerr != nil {
			return done, rerr
		}
	}
	return done, nil
}

// writeChunk writes the w bytes of buf at off (k of them data) and hashes the data.
func (j *Job) writeChunk(ctx context.Context, f *output, buf []byte, w, k int, off int64, h hash.Hash) error {
	if j.e.limiter != nil {
		if err := j.e.limiter.WaitN(ctx, k); err != nil {
			return err
		}
	}
	if err := f.writeAt(buf[:w], off); err != nil {
		return err
	}
	if h != nil {
		h.Write(buf[:k])
	}
	j.bytesDone.Add(int64(k))
	return nil
}

// chunkRead is a buffer read, to be written at off: w bytes, k of them data.
type chunkRead struct {
	buf  *[]byte
	w, k int
	off  int64
}

// copyPipelined is copyAt with two buffers: a stream no longer waits for the file's write (a
// direct write waits for the device) and the hash before it reads on. A node of a swarm reads its
// share of a large object from the source with one stream; with its cores and its disk busy
// serving and taking the others' shares, that stream read at 8-33 MB/s where the source had room
// for more, and the node whose share came last made every node wait (2 GiB × 4 nodes,
// docs/benchmarks.md, "Peer fan-out").
func (j *Job) copyPipelined(ctx context.Context, f *output, off, n int64, r io.Reader, h hash.Hash) (int64, error) {
	free := make(chan *[]byte, 2)
	for range 2 {
		bp := bufPool.Get().(*[]byte)
		defer bufPool.Put(bp)
		free <- bp
	}
	todo := make(chan chunkRead, 1)
	var (
		done    int64 // written and hashed: read by the reader only after the writer is over
		werr    error
		failed  atomic.Bool
		written = make(chan struct{})
	)
	go func() {
		defer close(written)
		for c := range todo {
			if werr == nil {
				if werr = j.writeChunk(ctx, f, *c.buf, c.w, c.k, c.off, h); werr != nil {
					failed.Store(true)
				} else {
					done += int64(c.k)
				}
			}
			free <- c.buf
		}
	}()
	var read int64
	var rerr error
	for read < n && !failed.Load() {
		bp := <-free
		buf := *bp
		want := min(int64(len(buf)), n-read)
		var k int
		k, rerr = io.ReadFull(r, buf[:want])
		w, k := f.chunk(buf[:want], k, off+read)
		if k > 0 {
			todo <- chunkRead{buf: bp, w: w, k: k, off: off + read}
			read += int64(k)
		} else {
			free <- bp
		}
		if rerr != nil {
			break
		}
	}
	close(todo)
	<-written
	switch {
	case werr != nil:
		return done, werr
	case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
		return done, nil
	}
	return done, rerr
}
