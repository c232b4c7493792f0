// Package units formats sizes for people: every status string, message and printer column of
// Cistern writes bytes through HumanBytes, so a staging reads "3.1 GiB of 12.5 GiB" wherever it
// is shown, never 3328599654 or 65795028Ki.
package units

import "fmt"

// HumanBytes formats n bytes in binary units with one decimal ("512 B", "1.0 KiB", "12.5 GiB").
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	sign, m := "", n
	if m < 0 {
		sign, m = "-", -m
	}
	div, exp := int64(unit), 0
	for v := m / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%s%.1f %ciB", sign, float64(m)/float64(div), "KMGTPE"[exp])
}

// Progress is done of total bytes in human units with the percentage ("3.1 GiB of 12.5 GiB,
// 24%"); "" when total is not known (0).
func Progress(done, total int64) string {
	if total <= 0 {
		return ""
	}
	return fmt.Sprintf("%s of %s, %d%%", HumanBytes(done), HumanBytes(total), percent(done, total))
}

// percent is done/total in whole percent, rounded down, so that 100% means all of it.
func percent(done, total int64) int64 {
	if done >= total {
		return 100
	}
	if done <= 0 {
		return 0
	}
	return int64(float64(done) / float64(total) * 100)
}
