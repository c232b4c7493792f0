package s3source

import (
	"context"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// TestPartsVersitygw: versitygw (v1.8.0) reports no parts (GetObjectAttributes answers without
// ObjectParts), so its multipart objects are read whole by a streaming volume; a single-PUT
// object has no parts without asking; an object overwritten since the listing is Changed.
func TestPartsVersitygw(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	f.s.PutMultipart(t, "data", "multi.bin", 12<<20, 5<<20, func(i int, buf []byte) {
		for k := range buf {
			buf[k] = byte(i + k)
		}
	})
	f.putCRC32C(t, "single.bin", []byte("one PUT"))
	src := f.source(t, "")
	objs := list(t, src)
	for _, key := range []string{"multi.bin", "single.bin"} {
		parts, err := src.Parts(ctx, objs[key])
		if err != nil || parts != nil {
			t.Errorf("%s: parts %v, err %v; want none", key, parts, err)
		}
	}
	f.s.PutMultipart(t, "data", "multi.bin", 11<<20, 5<<20, func(int, []byte) {})
	if _, err := src.Parts(ctx, objs["multi.bin"]); source.KindOf(err) != source.Changed {
		t.Errorf("parts of an object overwritten since the listing: %v, want Changed", err)
	}
}
