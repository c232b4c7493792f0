package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/ids"
)

const mb = int64(1) << 20

func twoPools(t *testing.T) *testEnv {
	return startDriver(t,
		testPool{name: "fast", labels: map[string]string{"media": "ssd"}, size: 256 * mb},
		testPool{name: "slow", labels: map[string]string{"media": "hdd"}, size: 512 * mb},
	)
}

func TestCreateVolumePlacement(t *testing.T) {
	testutilRoot(t)
	env := twoPools(t)
	tests := []struct {
		name     string
		params   map[string]string
		size     int64
		topology *csi.TopologyRequirement
		wantPool string
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "no parameters picks the pool with most free space", size: 32 * mb, wantPool: "slow"},
		{name: "pool parameter", params: map[string]string{"pool": "fast"}, size: 32 * mb, wantPool: "fast"},
		{name: "poolSelector parameter", params: map[string]string{"poolSelector": "media=ssd"}, size: 32 * mb, wantPool: "fast"},
		{name: "provisioner metadata keys are accepted", params: map[string]string{
			"pool": "fast", "csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "ml"}, size: 32 * mb, wantPool: "fast"},
		{name: "requisite topology of this node", size: 32 * mb, wantPool: "slow", topology: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: map[string]string{consts.TopologyKey: "node-1"}}}}},
		{name: "failure case - unknown parameter names the key", params: map[string]string{"pol": "fast"}, wantCode: codes.InvalidArgument, wantMsg: `"pol"`},
		{name: "failure case - bad poolSelector", params: map[string]string{"poolSelector": "media in ("}, wantCode: codes.InvalidArgument, wantMsg: "poolSelector"},
		{name: "failure case - pool not on this node is ResourceExhausted", params: map[string]string{"pool": "nvme"}, size: 32 * mb, wantCode: codes.ResourceExhausted, wantMsg: "nvme"},
		{name: "failure case - too large names the largest free size", size: 2048 * mb, wantCode: codes.ResourceExhausted, wantMsg: "largest free is"},
		{name: "failure case - other node's topology", size: 32 * mb, wantCode: codes.ResourceExhausted, topology: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: map[string]string{consts.TopologyKey: "node-2"}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
				Name: "vol-" + strings.ReplaceAll(tc.name, " ", "-"), CapacityRange: &csi.CapacityRange{RequiredBytes: tc.size},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: tc.params,
				AccessibilityRequirements: tc.topology,
			})
			if tc.wantCode != codes.OK {
				wantCode(t, err, tc.wantCode, tc.wantMsg)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			v := resp.GetVolume()
			if got := ids.PoolOfVolumeID(v.GetVolumeId()); got != tc.wantPool {
				t.Fatalf("volume in pool %q, want %q", got, tc.wantPool)
			}
			if seg := v.GetAccessibleTopology()[0].GetSegments()[consts.TopologyKey]; seg != "node-1" {
				t.Fatalf("accessible topology = %v", v.GetAccessibleTopology())
			}
			if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCreateVolumeIdempotency(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	req := &csi.CreateVolumeRequest{Name: "pvc-1", CapacityRange: &csi.CapacityRange{RequiredBytes: 20 * mb},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: map[string]string{"pool": "fast"}}
	first, err := env.ctrl.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := first.GetVolume().GetCapacityBytes(); got != 20*mb {
		t.Fatalf("capacity %d, want 20 MiB", got)
	}
	second, err := env.ctrl.CreateVolume(ctx, req)
	if err != nil || second.GetVolume().GetVolumeId() != first.GetVolume().GetVolumeId() {
		t.Fatalf("repeated CreateVolume: %v, %v", second, err)
	}
	req.CapacityRange.RequiredBytes = 40 * mb
	_, err = env.ctrl.CreateVolume(ctx, req)
	wantCode(t, err, codes.AlreadyExists, "")
	req.CapacityRange.RequiredBytes = 20 * mb
	req.Parameters = map[string]string{"pool": "fast", "poolSelector": "media=ssd"}
	_, err = env.ctrl.CreateVolume(ctx, req)
	wantCode(t, err, codes.AlreadyExists, "parameters")

	// Size rounding and bounds.
	_, err = env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "tiny", CapacityRange: &csi.CapacityRange{LimitBytes: 4 * mb},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}})
	wantCode(t, err, codes.OutOfRange, "smallest ext4")
	odd, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "odd", CapacityRange: &csi.CapacityRange{RequiredBytes: 20*mb + 1},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}})
	if err != nil || odd.GetVolume().GetCapacityBytes() != 21*mb {
		t.Fatalf("odd size: %v %v", odd, err)
	}
	_, err = env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "multi", VolumeCapabilities: []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}}}})
	wantCode(t, err, codes.InvalidArgument, "node-local")

	// Delete is idempotent.
	for i := 0; i < 2; i++ {
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: first.GetVolume().GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGetCapacity(t *testing.T) {
	testutilRoot(t)
	env := twoPools(t)
	ctx := context.Background()
	all, err := env.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fast, err := env.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"pool": "fast", "csi.storage.k8s.io/fstype": "ext4"}})
	if err != nil {
		t.Fatal(err)
	}
	ssd, err := env.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"poolSelector": "media=ssd"}})
	if err != nil {
		t.Fatal(err)
	}
	if fast.GetAvailableCapacity() != ssd.GetAvailableCapacity() {
		t.Fatalf("pool and selector disagree: %d vs %d", fast.GetAvailableCapacity(), ssd.GetAvailableCapacity())
	}
	if all.GetAvailableCapacity() <= fast.GetAvailableCapacity() {
		t.Fatalf("all pools (%d) not more than one (%d)", all.GetAvailableCapacity(), fast.GetAvailableCapacity())
	}
	if all.GetMaximumVolumeSize().GetValue() >= all.GetAvailableCapacity() || all.GetMaximumVolumeSize().GetValue() <= fast.GetAvailableCapacity() {
		t.Fatalf("maximum volume size %d should be the slow pool's share of %d", all.GetMaximumVolumeSize().GetValue(), all.GetAvailableCapacity())
	}
	// The largest single volume really fits, and one byte more does not.
	max := all.GetMaximumVolumeSize().GetValue() / mb * mb
	v := env.create("max", max, nil)
	env.driver.pools.Refresh()
	after, _ := env.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"pool": "slow"}})
	if after.GetAvailableCapacity() >= mb {
		t.Fatalf("slow pool still reports %d bytes after its largest volume", after.GetAvailableCapacity())
	}
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	other, err := env.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{consts.TopologyKey: "node-2"}}})
	if err != nil || other.GetAvailableCapacity() != 0 {
		t.Fatalf("other node's capacity: %v %v", other, err)
	}
	_, err = env.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"typo": "x"}})
	wantCode(t, err, codes.InvalidArgument, "typo")
}
