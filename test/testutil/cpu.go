package testutil

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// MachineCPU is the CPU seconds all cores spent since boot (/proc/stat's first line): in all,
// busy (neither idle nor waiting for I/O: kernel threads and every process), and waiting for
// I/O. A benchmark takes two readings and reports the difference.
func MachineCPU() (total, busy, iowait float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0, fmt.Errorf("/proc/stat: %q", line)
	}
	for k, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		t := float64(n) / clockTicks
		total += t
		switch k {
		case 3: // idle
		case 4:
			iowait += t
		default:
			busy += t
		}
	}
	return total, busy, iowait, nil
}

// ProcCPU is a process's CPU seconds so far (user and system, all its threads), and its waited-for
// children's; zero when it is gone.
func ProcCPU(pid int) (own, children float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 15 {
		return 0, 0
	}
	var t [4]float64 // utime stime cutime cstime
	for i, v := range f[11:15] {
		t[i], err = strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0
		}
	}
	return (t[0] + t[1]) / clockTicks, (t[2] + t[3]) / clockTicks
}
