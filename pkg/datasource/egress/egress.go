// Package egress decides which network addresses a dataset source may connect to. Pod authors
// name S3 endpoints in inline volumes and VolumeManagers; without these checks the node would
// fetch whatever they point at (cloud metadata services, the node's link-local neighbours) and
// write the answer into their volume. The checks run at dial time, on the address actually
// connected to, so a name that resolves differently later (DNS rebinding) is caught as well.
package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// metadataAddrs are cloud instance-metadata services outside the link-local ranges (AWS's IPv6
// endpoint, Alibaba Cloud's). The IPv4 ones of AWS, GCP, Azure and Oracle are 169.254.169.254.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("100.100.100.200"),
}

// nat64 is the well-known NAT64 prefix (RFC 6052): 64:ff9b::a9fe:a9fe is 169.254.169.254.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// metadataNames resolve to a metadata service; refused before any lookup, as a proxy would
// resolve them itself.
var metadataNames = []string{"metadata.google.internal", "metadata.goog", "metadata", "instance-data"}

// Forbidden returns an error for addresses no source may reach, whoever configured it:
// link-local (169.254.0.0/16, fe80::/10, where the metadata services live) and the metadata
// services' other addresses.
func Forbidden(ip netip.Addr) error {
	ip = ip.Unmap()
	if nat64.Contains(ip) { // an IPv4 address through a NAT64 gateway
		b := ip.As16()
		ip = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	if ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
		return fmt.Errorf("address %s is link-local", ip)
	}
	for _, m := range metadataAddrs {
		if ip == m {
			return fmt.Errorf("address %s is a cloud metadata service", ip)
		}
	}
	return nil
}

// ForbiddenHost refuses a host name that names a metadata service.
func ForbiddenHost(host string) error {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	for _, n := range metadataNames {
		if h == n {
			return fmt.Errorf("host %s is a cloud metadata service", host)
		}
	}
	if ip, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return Forbidden(ip)
	}
	return nil
}

// Policy is what one source may connect to: never a Forbidden address, and, when Nets is not
// empty, only addresses inside Nets.
type Policy struct {
	Nets []netip.Prefix
}

// Check applies the policy to one address.
func (p Policy) Check(ip netip.Addr) error {
	if err := Forbidden(ip); err != nil {
		return err
	}
	if len(p.Nets) == 0 {
		return nil
	}
	ip = ip.Unmap()
	for _, n := range p.Nets {
		if n.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("address %s is not in the allowed endpoint networks", ip)
}

// Control is a net.Dialer Control function: it runs after name resolution and before the
// connection is made, on the address about to be connected to.
func (p Policy) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &DeniedError{Err: fmt.Errorf("unexpected dial address %q", address)}
	}
	if err := p.Check(ap.Addr()); err != nil {
		return &DeniedError{Err: err}
	}
	return nil
}

// DialContext dials through d with the policy as its Control function.
func (p Policy) DialContext(d net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d.Control = p.Control
	return d.DialContext
}

// DeniedError is a connection the policy refused.
type DeniedError struct{ Err error }

func (e *DeniedError) Error() string {
	return "connection refused by the endpoint policy: " + e.Err.Error()
}
func (e *DeniedError) Unwrap() error { return e.Err }

// Allow is the administrator's list of endpoints that untrusted volumes (inline volumes,
// VolumeManagers) may name. Empty refuses every endpoint (tenants fail closed until the
// administrator lists networks); "*" (Any) allows every endpoint that is not Forbidden.
type Allow struct {
	// Any allows every endpoint that is not Forbidden (the entry "*").
	Any bool
	// Hosts are endpoint host names: exact ("s3.example.com") or a suffix ("*.example.com").
	Hosts []string
	// Nets are networks whose addresses are allowed, whatever name leads there.
	Nets []netip.Prefix
}

// ParseAllow reads a list of host names, "*.domain" suffixes and CIDR blocks.
func ParseAllow(entries []string) (Allow, error) {
	var a Allow
	for _, e := range entries {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
		case e == "*":
			a.Any = true
		case strings.Contains(e, "/"):
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return Allow{}, fmt.Errorf("endpoint allow-list entry %q: %w", e, err)
			}
			a.Nets = append(a.Nets, p.Masked())
		case strings.ContainsAny(e, ":[]") || strings.Contains(strings.TrimPrefix(e, "*."), "*"):
			return Allow{}, fmt.Errorf("endpoint allow-list entry %q: want a host name, *.domain or a CIDR block", e)
		default:
			if ip, err := netip.ParseAddr(e); err == nil {
				a.Nets = append(a.Nets, netip.PrefixFrom(ip, ip.BitLen()))
				continue
			}
			a.Hosts = append(a.Hosts, strings.ToLower(strings.TrimSuffix(e, ".")))
		}
	}
	return a, nil
}

// Empty reports whether the list allows no endpoint at all.
func (a Allow) Empty() bool { return !a.Any && len(a.Hosts) == 0 && len(a.Nets) == 0 }

// Policy returns what a source with an endpoint on host may connect to, or an error when no
// address could be allowed. A host the list names may go wherever it resolves (except Forbidden
// addresses); any other host only to the listed networks.
func (a Allow) Policy(host string) (Policy, error) {
	if err := ForbiddenHost(host); err != nil {
		return Policy{}, err
	}
	if a.Empty() {
		return Policy{}, fmt.Errorf("endpoint host %s refused: tenant S3 endpoints are refused until the administrator lists them in --tenant-s3-endpoints (\"*\" allows any)", host)
	}
	if a.Any || a.hostAllowed(host) {
		return Policy{}, nil
	}
	if len(a.Nets) == 0 {
		return Policy{}, fmt.Errorf("endpoint host %s is not in the administrator's allow-list", host)
	}
	return Policy{Nets: a.Nets}, nil
}

func (a Allow) hostAllowed(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	for _, e := range a.Hosts {
		if suffix, ok := strings.CutPrefix(e, "*"); ok {
			if strings.HasSuffix(h, suffix) {
				return true
			}
		} else if h == e {
			return true
		}
	}
	return false
}
