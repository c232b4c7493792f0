package datasource_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestAnonymousTenantKeepsEndpointPolicy (issue 24, item 6): an administrator's StorageClass
// stages a public bucket from an internal endpoint, anonymously. A pod author names the same
// source in an inline volume, anonymously too, where --tenant-s3-endpoints does not allow that
// endpoint. The two anonymous callers are not one principal: the tenant neither joins the
// staging under way nor is served the cached dataset, since its own proof may dial nothing
// outside the allowed networks.
func TestAnonymousTenantKeepsEndpointPolicy(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "internal")
	smallTree(31, 6, 500).upload(t, s, "internal", "set/")
	bucketPolicy(t, s, "internal", anonymousList("internal"), anonymousRead("internal", "set/*"))
	proxy := testpeers.StartProxy(t, s.Endpoint, delayObjects(400*time.Millisecond))
	allow, err := egress.ParseAllow([]string{"192.0.2.0/24"}) // not the loopback the server is on
	if err != nil {
		t.Fatal(err)
	}
	pool := t.TempDir()
	m := newManager(t, datasource.Config{Concurrency: 1, AccessProofTTL: time.Minute, TenantEndpoints: allow})
	admin := mustSpec(t, s3Params(s, proxy.URL, "s3://internal/set"))
	inline := *admin
	inline.Tenant = true
	tenant := datasource.Request{Spec: &inline, Pool: pool}

	if _, err := m.Ensure(ctx, datasource.Request{Spec: admin, Pool: pool}); err != nil {
		t.Fatal(err)
	}
	for {
		st, _, _ := m.Status(pool, admin)
		if st.Phase == datasource.PhaseFetching {
			break
		}
		if st.Phase == datasource.PhaseFailed || ctx.Err() != nil {
			t.Fatalf("the administrator's staging never started fetching: %q", st.Phase)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := m.Wait(ctx, tenant)
	wantCode(t, err, codes.PermissionDenied)
	if st.Ready() || st.BytesTotal != 0 {
		t.Fatalf("joining, the tenant was told %v", st)
	}

	proxy.SetFaults(nil)
	if _, err := stage(ctx, t, m, datasource.Request{Spec: admin, Pool: pool}); err != nil {
		t.Fatal(err)
	}
	st, err = m.Wait(ctx, tenant)
	wantCode(t, err, codes.PermissionDenied)
	if st.Ready() {
		t.Fatalf("the tenant was served the cached dataset: %v", st)
	}
}
