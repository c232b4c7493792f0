package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/testpeers"
)

// BenchmarkAccessProof measures what a cache hit's access proof costs on the small-file set
// (20,000 × 32 KiB), as a fraction of staging the same set in the same child process: the first
// hit of a caller without a remembered proof (a listing and one HEAD per file), and a hit with a
// remembered proof (one pinned read). `make bench-access-proof`; CISTERN_BENCH_REPS (default 3).
func BenchmarkAccessProof(b *testing.B) {
	reps := 3
	if n, err := strconv.Atoi(os.Getenv("CISTERN_BENCH_REPS")); err == nil && n > 0 {
		reps = n
	}
	base := b.TempDir()
	s := testpeers.StartS3(b, filepath.Join(base, "s3"))
	sh := shapes[2]
	s.Bucket(b, "proof")
	start := time.Now()
	upload(b, s, "proof", sh)
	b.Logf("%s: uploaded in %s", sh.name, time.Since(start))
	var first, hit []float64
	for r := range reps {
		dst, done := freshFS(b, base, fmt.Sprintf("run%d", r), 3*int64(sh.objects)*sh.size+1<<30)
		res := stageChild(b, s, "proof", dst, "")
		done()
		first = append(first, res.FullHitSeconds/res.StageSeconds)
		hit = append(hit, res.HitSeconds/res.StageSeconds)
		b.Logf("run %d: staging %.2fs, first hit %.0fms (%.1f%%), remembered hit %.2fms (%.3f%%)", r+1,
			res.StageSeconds, res.FullHitSeconds*1e3, 100*first[r], res.HitSeconds*1e3, 100*hit[r])
	}
	pct := func(v []float64) string {
		s := slices.Clone(v)
		slices.Sort(s)
		return fmt.Sprintf("min %.3f%% / median %.3f%% / max %.3f%%", 100*s[0], 100*s[len(s)/2], 100*s[len(s)-1])
	}
	fmt.Printf("access proof, %s: first hit / staging %s; remembered hit / staging %s\n", sh.name, pct(first), pct(hit))
}
