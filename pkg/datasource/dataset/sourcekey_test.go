package dataset

import (
	"context"
	"testing"

	"github.com/cistern-csi/cistern/pkg/params"
)

// TestSourceKey: the spellings of one server share a key (those the HTTP client dials alike, and
// those a resolver answers alike without asking anyone: trailing dots, localhost); other servers
// do not.
func TestSourceKey(t *testing.T) {
	s3 := func(endpoint string) *Spec {
		return &Spec{Dataset: params.Dataset{Scheme: SchemeS3, Endpoint: endpoint}}
	}
	nfs := func(host string) *Spec { return &Spec{Dataset: params.Dataset{Scheme: SchemeNFS, Host: host}} }
	for _, tc := range []struct {
		name string
		same []*Spec
	}{
		{"loopback", []*Spec{s3("http://127.0.0.1:9000"), s3("http://127.0.0.1:9000/"), s3("HTTP://127.0.0.1:9000"),
			s3("http://localhost:9000?"), s3("http://LOCALHOST.:9000/x"), s3("http://[::ffff:127.0.0.1]:9000"),
			s3("http://127.0.0.1.:09000"), s3("http://[::1]:9000"), s3("http://0.0.0.0:9000"), s3("http://s3.localhost:9000"),
			s3("http://ｌｏｃａｌｈｏｓｔ:9000")}},
		{"default port", []*Spec{s3("https://s3.example.com"), s3("https://s3.example.com:443"), s3("https://S3.Example.COM.:443/"),
			s3("https://s3.example.com?#f")}},
		{"http default port", []*Spec{s3("http://10.0.0.1"), s3("http://10.0.0.1:80"), s3("http://[::ffff:a00:1]:80")}},
		{"IPv6", []*Spec{s3("https://[2001:db8::1]"), s3("https://[2001:0DB8:0:0::1]:443")}},
		{"NFS server", []*Spec{nfs("nfs.example.com"), nfs("NFS.example.com.:2049"), nfs("nfs.example.com:20490")}},
		{"NFS IPv6", []*Spec{nfs("[2001:db8::1]"), nfs("[2001:db8:0::1]:2049")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := SourceKey(tc.same[0])
			for _, s := range tc.same[1:] {
				if got := SourceKey(s); got != want {
					t.Errorf("%s%s: key %q, want %q (%s)", s.Endpoint, s.Host, got, want, tc.same[0].Endpoint+tc.same[0].Host)
				}
			}
		})
	}
	distinct := []*Spec{s3("http://127.0.0.1:9000"), s3("http://127.0.0.1:9001"), s3("https://127.0.0.1:9000"),
		s3("https://s3.example.com"), s3("https://s3.example.com:8443"), s3("https://s4.example.com"), s3("http://10.0.0.1"),
		{Dataset: params.Dataset{Scheme: SchemeS3, Region: "us-east-1"}}, {Dataset: params.Dataset{Scheme: SchemeS3, Region: "eu-west-1"}},
		nfs("nfs.example.com"), {Dataset: params.Dataset{Scheme: SchemeLocal}}}
	seen := map[string]string{}
	for _, s := range distinct {
		k := SourceKey(s)
		if other, ok := seen[k]; ok {
			t.Errorf("%s and %s share key %q", other, s.Endpoint+s.Host+s.Region, k)
		}
		seen[k] = s.Endpoint + s.Host + s.Region
	}
}

// TestKeyedSlotsForgetIdleKeys: a key's slots go with their last holder and waiter, so listings
// naming ever new endpoints or namespaces leave nothing behind.
func TestKeyedSlotsForgetIdleKeys(t *testing.T) {
	k := keyedSlots{size: 1}
	ctx := context.Background()
	release, err := k.acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := k.acquire(cctx, "a"); err == nil {
		t.Fatal("a second slot of a key of size 1")
	}
	for i := range 100 {
		r, err := k.acquire(ctx, string(rune('b'+i)))
		if err != nil {
			t.Fatal(err)
		}
		r()
	}
	if n := k.held(); n != 1 {
		t.Errorf("%d keys kept, want only the one held", n)
	}
	release()
	if n := k.held(); n != 0 {
		t.Errorf("%d keys kept after every slot was released", n)
	}
}
