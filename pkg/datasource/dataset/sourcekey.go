package dataset

import (
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// SourceKey names the server a source reads from, for the per-source slots (of listings, of
// reads): one key however a pod author spells the endpoint, or one server could hold a node's
// slots once per spelling. An S3 endpoint is its scheme, host and port: scheme and host in lower
// case, the host as the HTTP client dials it (IDNA) without trailing dots, an IP address in its
// canonical form (an IPv4-mapped IPv6 address as the IPv4 one), every loopback and unspecified
// address and every localhost name as one host (the node itself), the scheme's default port
// written out; path, query and fragment dropped. An NFS server is its host: whichever port, or
// the portmapper, reaches it. Names are not resolved (the answer is the name owner's to
// change): distinct names of one server are bounded by their namespace's slots instead
// (Limits.ListingsPerNamespace).
func SourceKey(s *Spec) string {
	switch s.Scheme {
	case SchemeS3:
		if s.Endpoint != "" {
			return "s3 " + endpointKey(s.Endpoint)
		}
		return "s3 aws " + strings.ToLower(s.Region)
	case SchemeNFS:
		host := s.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		return "nfs " + hostKey(strings.Trim(host, "[]"))
	}
	return string(s.Scheme)
}

// defaultPorts are the ports an S3 endpoint's scheme implies.
var defaultPorts = map[string]string{"http": "80", "https": "443"}

// loopbackKey stands for every address of the node itself.
const loopbackKey = "loopback"

// endpointKey is an S3 endpoint's scheme, host and port (SourceKey).
func endpointKey(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return strings.ToLower(raw) // params refuses such an endpoint before it gets here
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if n, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(n, 10) // "080" dials 80
	}
	if port == "" {
		port = defaultPorts[scheme]
	}
	return scheme + "://" + net.JoinHostPort(hostKey(u.Hostname()), port)
}

// hostKey is a host name or address as SourceKey compares them.
func hostKey(h string) string {
	h = strings.TrimRight(strings.ToLower(h), ".")
	if a, err := idna.Lookup.ToASCII(h); err == nil {
		h = a
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsUnspecified() { // connecting to 0.0.0.0 or :: reaches the node
			return loopbackKey
		}
		return ip.String()
	}
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return loopbackKey
	}
	return h
}
