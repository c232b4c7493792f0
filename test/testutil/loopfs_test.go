package testutil_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/test/testutil"
)

// TestLoopDevicesUnder: a filesystem image attached to a loop device is listed under its
// directory (and under no other), and DetachLoopsUnder frees it.
func TestLoopDevicesUnder(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "pool.img")
	testutil.FSImage(t, img, "ext4", 32<<20)
	// Attached without a mount, so that nothing but DetachLoopsUnder frees it.
	dev := strings.TrimSpace(testutil.Run(t, "losetup", "--find", "--show", img))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })

	if got := testutil.LoopDevicesUnder(dir); len(got) != 1 || got[dev] != img {
		t.Fatalf("LoopDevicesUnder(%s) = %v, want %s backed by %s", dir, got, dev, img)
	}
	if other := t.TempDir(); len(testutil.LoopDevicesUnder(other)) != 0 {
		t.Errorf("LoopDevicesUnder(%s) = %v, want none", other, testutil.LoopDevicesUnder(other))
	}
	testutil.DetachLoopsUnder(dir)
	if got := testutil.LoopDevicesUnder(dir); len(got) != 0 {
		t.Errorf("after DetachLoopsUnder: %v", got)
	}
}
