package units

import (
	"math"
	"testing"
)

func TestHumanBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{65795028 << 10, "62.7 GiB"}, // a StoragePool's 65795028Ki
		{3328599654, "3.1 GiB"},      // a VolumeManager's raw bytes
		{12800 << 20, "12.5 GiB"},    // 12800Mi
		{1 << 50, "1.0 PiB"},
		{math.MaxInt64, "8.0 EiB"},
		{-2048, "-2.0 KiB"},
	} {
		if got := HumanBytes(tc.n); got != tc.want {
			t.Errorf("HumanBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestProgress(t *testing.T) {
	for _, tc := range []struct {
		done, total int64
		want        string
	}{
		{0, 0, ""},
		{5, 0, ""},
		{0, 12800 << 20, "0 B of 12.5 GiB, 0%"},
		{3328599654, 12800 << 20, "3.1 GiB of 12.5 GiB, 24%"},
		{12800<<20 - 1, 12800 << 20, "12.5 GiB of 12.5 GiB, 99%"},
		{12800 << 20, 12800 << 20, "12.5 GiB of 12.5 GiB, 100%"},
	} {
		if got := Progress(tc.done, tc.total); got != tc.want {
			t.Errorf("Progress(%d, %d) = %q, want %q", tc.done, tc.total, got, tc.want)
		}
	}
}
