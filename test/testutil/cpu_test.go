package testutil

import (
	"os"
	"testing"
)

// TestCPUReadings: the machine's busy and I/O-wait seconds are parts of its total, and this
// process's own CPU is counted and grows with work.
func TestCPUReadings(t *testing.T) {
	total, busy, iowait, err := MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	if total <= 0 || busy <= 0 || busy+iowait > total {
		t.Fatalf("MachineCPU: total %v busy %v iowait %v", total, busy, iowait)
	}
	before, _ := ProcCPU(os.Getpid())
	x := 0
	for i := range 200_000_000 {
		x += i % 7
	}
	after, _ := ProcCPU(os.Getpid())
	if after <= before {
		t.Fatalf("ProcCPU did not grow with work (%v then %v; %d)", before, after, x)
	}
}
