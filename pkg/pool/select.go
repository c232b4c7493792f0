package pool

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/labels"
)

// Request says what a new volume needs from a pool.
type Request struct {
	// Name, when set, allows only the pool with that name.
	Name string
	// Selector, when set, allows only pools whose labels match.
	Selector labels.Selector
	// RequiredBytes is the space the volume takes.
	RequiredBytes int64
}

// NoRoomError is returned when no allowed pool can hold a request. The driver maps it to
// ResourceExhausted, which lets external-provisioner try again or another node.
type NoRoomError struct {
	msg string
}

func (e *NoRoomError) Error() string { return e.msg }

// Matching returns the pools allowed by name and selector, healthy or not.
func Matching(pools []Status, name string, sel labels.Selector) []Status {
	var out []Status
	for _, p := range pools {
		if name != "" && p.Name != name {
			continue
		}
		if sel != nil && !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// Select picks the healthy allowed pool with the most free space that can hold the request.
// Unhealthy pools are never chosen.
func Select(pools []Status, req Request) (Status, error) {
	allowed := Matching(pools, req.Name, req.Selector)
	if len(allowed) == 0 {
		switch {
		case req.Name != "":
			return Status{}, &NoRoomError{msg: fmt.Sprintf("no pool named %q on this node", req.Name)}
		case req.Selector != nil:
			return Status{}, &NoRoomError{msg: fmt.Sprintf("no pool matches poolSelector %q on this node", req.Selector.String())}
		default:
			return Status{}, &NoRoomError{msg: "no pools are configured on this node"}
		}
	}
	var best *Status
	var largest int64
	var largestName string
	var unhealthy []string
	for i := range allowed {
		p := &allowed[i]
		if !p.Healthy {
			unhealthy = append(unhealthy, p.Name+" ("+p.Message+")")
			continue
		}
		if free := MaxVolumeBytes(*p); free > largest {
			largest, largestName = free, p.Name
		}
		if MaxVolumeBytes(*p) < req.RequiredBytes {
			continue
		}
		if best == nil || p.AvailableBytes > best.AvailableBytes {
			best = p
		}
	}
	if best != nil {
		return *best, nil
	}
	msg := fmt.Sprintf("no pool can hold %d bytes: largest free is %d bytes", req.RequiredBytes, largest)
	if largestName != "" {
		msg += fmt.Sprintf(" (pool %q)", largestName)
	}
	if len(unhealthy) > 0 {
		sort.Strings(unhealthy)
		msg += fmt.Sprintf("; unhealthy: %v", unhealthy)
	}
	return Status{}, &NoRoomError{msg: msg}
}

// MaxVolumeBytes is the largest single volume a pool can still hold: its free space less the
// reserve that keeps it from counting as full. Zero for an unhealthy pool.
func MaxVolumeBytes(p Status) int64 {
	if !p.Healthy {
		return 0
	}
	free := p.AvailableBytes - minFree(p.TotalBytes)
	if free < 0 {
		return 0
	}
	return free
}

func sortStatuses(s []Status) {
	sort.Slice(s, func(i, j int) bool { return s[i].Name < s[j].Name })
}
