package testutil

import (
	"fmt"
	"os"
	"testing"
)

func TestMemFree(t *testing.T) {
	free, err := memFree()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var totalKiB int64
	if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &totalKiB); err != nil {
		t.Fatal(err)
	}
	if free <= 0 || free > totalKiB<<10 {
		t.Fatalf("MemFree %d bytes, MemTotal %d KiB", free, totalKiB)
	}
}
