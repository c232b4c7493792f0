package testutil

// Benchmarks on a virtual machine that returns its free memory to the host.
//
// With free page reporting (virtio-balloon), the guest kernel hands blocks of free memory back
// to the host a few seconds after they are freed, and the next touch of each of their pages is a
// fault in the host. On the machine these benchmarks run on that fault cost about 3.5 µs per
// 4 KiB page: a 64 MiB file's first read took 72 ms when its page cache landed on reported
// memory, 14 ms otherwise, through the pool or a streaming volume alike. Which case of a
// benchmark paid it depended on what memory the kernel handed it (a case right after a drop of
// the page cache, a case that grew the page cache past what was freed last), not on the code
// it measured.

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// pageReportingOrder is the kernel's knob: blocks of free memory of this order and above are
// reported to the host.
const pageReportingOrder = "/sys/module/page_reporting/parameters/page_reporting_order"

// noReporting is above the largest order of the page allocator (10 on x86-64): no block is
// reported.
const noReporting = "11"

// HoldGuestMemory keeps the machine's free memory in the guest for the test: it stops free page
// reporting (restored at cleanup) and touches the free memory once, less a margin, so that what
// was reported before is the guest's again. It says what it did, for the benchmark's output;
// where the kernel reports no free pages it does nothing.
func HoldGuestMemory(t testing.TB) string {
	t.Helper()
	was, err := os.ReadFile(pageReportingOrder)
	if err != nil {
		return "free page reporting: none"
	}
	if err := os.WriteFile(pageReportingOrder, []byte(noReporting), 0); err != nil {
		t.Fatalf("stopping free page reporting: %v", err)
	}
	t.Cleanup(func() { _ = os.WriteFile(pageReportingOrder, was, 0) })
	free, err := memFree()
	if err != nil {
		t.Fatal(err)
	}
	// Left untouched: what the machine's other processes may allocate meanwhile.
	const margin = 2 << 30
	if free <= margin {
		return "free page reporting: stopped"
	}
	// MAP_POPULATE faults every page in at once; unmapped, they go back to the free lists,
	// the guest's now.
	mem, err := unix.Mmap(-1, 0, int(free-margin), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE|unix.MAP_NORESERVE)
	if err != nil {
		t.Fatalf("touching the free memory: %v", err)
	}
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("free page reporting: stopped (was order %s), %d MiB of free memory touched", strings.TrimSpace(string(was)), (free-margin)>>20)
}

// memFree is /proc/meminfo's MemFree in bytes.
func memFree() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		var kib int64
		if _, err := fmt.Sscanf(s.Text(), "MemFree: %d kB", &kib); err == nil {
			return kib << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo: no MemFree")
}
