package pool

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

const gib = int64(1) << 30

func status(name string, avail int64, healthy bool, lbls map[string]string) Status {
	return Status{Spec: Spec{Name: name, Path: "/" + name, Labels: lbls}, TotalBytes: 100 * gib, AvailableBytes: avail, Healthy: healthy}
}

func TestSelect(t *testing.T) {
	pools := []Status{
		status("fast", 10*gib, true, map[string]string{"media": "ssd"}),
		status("slow", 50*gib, true, map[string]string{"media": "hdd"}),
		status("broken", 90*gib, false, map[string]string{"media": "ssd"}),
		status("nvme", 20*gib, true, map[string]string{"media": "ssd", "tier": "hot"}),
	}
	ssd := labels.SelectorFromSet(labels.Set{"media": "ssd"})
	tests := []struct {
		name    string
		req     Request
		want    string
		wantErr string
	}{
		{name: "no parameters takes the healthy pool with most free space", req: Request{RequiredBytes: gib}, want: "slow"},
		{name: "named pool", req: Request{Name: "fast", RequiredBytes: gib}, want: "fast"},
		{name: "selector picks most free among matching, skipping unhealthy", req: Request{Selector: ssd, RequiredBytes: gib}, want: "nvme"},
		{name: "selector falls back to a smaller pool when the largest cannot hold it", req: Request{Selector: ssd, RequiredBytes: 15 * gib}, want: "nvme"},
		{name: "failure case - unknown pool", req: Request{Name: "nope", RequiredBytes: gib}, wantErr: `no pool named "nope"`},
		{name: "failure case - selector matches nothing", req: Request{Selector: labels.SelectorFromSet(labels.Set{"media": "tape"}), RequiredBytes: gib}, wantErr: "no pool matches"},
		{name: "failure case - unhealthy pool is never chosen", req: Request{Name: "broken", RequiredBytes: gib}, wantErr: "unhealthy"},
		{name: "failure case - too large names the largest free size", req: Request{RequiredBytes: 80 * gib}, wantErr: "largest free is"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Select(pools, tc.req)
			if tc.wantErr != "" {
				var noRoom *NoRoomError
				if !errors.As(err, &noRoom) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want NoRoomError containing %q, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tc.want {
				t.Fatalf("want pool %s, got %s", tc.want, got.Name)
			}
		})
	}
}

func TestMaxVolumeBytesKeepsReserve(t *testing.T) {
	p := status("a", 10*gib, true, nil)
	// 1% of 100 GiB, capped at 1 GiB, stays free so the pool never reports itself full.
	if got, want := MaxVolumeBytes(p), 9*gib; got != want {
		t.Fatalf("MaxVolumeBytes = %d, want %d", got, want)
	}
	p.Healthy = false
	if got := MaxVolumeBytes(p); got != 0 {
		t.Fatalf("unhealthy pool MaxVolumeBytes = %d, want 0", got)
	}
	small := Status{Spec: Spec{Name: "s"}, TotalBytes: 10 << 20, AvailableBytes: 512 << 10, Healthy: true}
	if got := MaxVolumeBytes(small); got != 0 {
		t.Fatalf("pool below its reserve MaxVolumeBytes = %d, want 0", got)
	}
}
