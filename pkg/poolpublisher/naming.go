package poolpublisher

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// hashLen is the number of hex digits of the hash suffix that keeps shortened names unique.
const hashLen = 10

var invalidNameChars = regexp.MustCompile(`[^a-z0-9-]+`)

// ObjectName is the StoragePool object name for a pool.
//
// A pool on one node is named "<pool>.<node>": pool names are DNS labels (no dots) while node
// names may contain dots, so the first dot splits the two and two nodes each with a pool "fast"
// never collide. A shared pool (one pool reachable from several nodes) is named "<pool>": it has
// no dot, so it cannot collide with a node-local name either. When the parts are not valid DNS
// labels, or the result is longer than a DNS subdomain, the name is shortened and sanitized and
// gets a hash of the exact (pool, node) pair, e.g. "my-pool-3f2a9c01de".
func ObjectName(pool, node string, shared bool) string {
	if shared {
		if len(validation.IsDNS1123Label(pool)) == 0 {
			return pool
		}
		return hashedName(pool, "", shared)
	}
	name := pool + "." + node
	if len(validation.IsDNS1123Label(pool)) == 0 && len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	return hashedName(pool, node, shared)
}

func hashedName(pool, node string, shared bool) string {
	key := "local\x00" + pool + "\x00" + node
	if shared {
		key = "shared\x00" + pool
	}
	sum := sha256.Sum256([]byte(key))
	suffix := hex.EncodeToString(sum[:])[:hashLen]
	prefix := sanitize(pool, 40)
	if !shared {
		prefix += "." + sanitize(node, 200)
	}
	return prefix + "-" + suffix
}

// sanitize turns s into lowercase DNS-label characters, at most max long, never starting or
// ending with a dash; it is only used together with a hash, so it may lose information.
func sanitize(s string, max int) string {
	s = invalidNameChars.ReplaceAllString(strings.ToLower(s), "-")
	if len(s) > max {
		s = s[:max]
	}
	s = strings.Trim(s, "-")
	if s == "" {
		s = "x"
	}
	return s
}

// LabelValue returns v when it is a valid label value, else a shortened, sanitized form with a
// hash of v, so that selecting by the label still finds exactly one node's or pool's objects.
func LabelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	prefix := strings.Trim(invalidNameChars.ReplaceAllString(strings.ToLower(v), "-"), "-.")
	if len(prefix) > validation.LabelValueMaxLength-hashLen-1 {
		prefix = strings.Trim(prefix[:validation.LabelValueMaxLength-hashLen-1], "-")
	}
	if prefix == "" {
		return hex.EncodeToString(sum[:])[:hashLen]
	}
	return prefix + "-" + hex.EncodeToString(sum[:])[:hashLen]
}
