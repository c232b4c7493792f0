package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestForbidden(t *testing.T) {
	for _, tc := range []struct {
		addr      string
		forbidden bool
	}{
		{"169.254.169.254", true},
		{"169.254.0.1", true},
		{"::ffff:169.254.169.254", true},
		{"fe80::1", true},
		{"fd00:ec2::254", true},
		{"100.100.100.200", true},
		{"64:ff9b::a9fe:a9fe", true},
		{"64:ff9b::a00:1", false},
		{"127.0.0.1", false},
		{"::1", false},
		{"10.1.2.3", false},
		{"192.168.1.10", false},
		{"fd00:ec2::253", false},
		{"2001:db8::1", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			if err := Forbidden(netip.MustParseAddr(tc.addr)); (err != nil) != tc.forbidden {
				t.Fatalf("Forbidden(%s) = %v, want forbidden=%v", tc.addr, err, tc.forbidden)
			}
		})
	}
}

func TestForbiddenHost(t *testing.T) {
	for _, tc := range []struct {
		host      string
		forbidden bool
	}{
		{"metadata.google.internal", true},
		{"METADATA.google.internal.", true},
		{"169.254.169.254", true},
		{"[fd00:ec2::254]", true},
		{"s3.example.com", false},
		{"metadata.example.com", false},
		{"127.0.0.1", false},
	} {
		t.Run(tc.host, func(t *testing.T) {
			if err := ForbiddenHost(tc.host); (err != nil) != tc.forbidden {
				t.Fatalf("ForbiddenHost(%s) = %v, want forbidden=%v", tc.host, err, tc.forbidden)
			}
		})
	}
}

func TestControl(t *testing.T) {
	open := Policy{}
	nets := Policy{Nets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd12::/16")}}
	for _, tc := range []struct {
		name    string
		policy  Policy
		address string
		denied  bool
	}{
		{"open policy, loopback", open, "127.0.0.1:9000", false},
		{"open policy, metadata", open, "169.254.169.254:80", true},
		{"open policy, IPv6 link-local", open, "[fe80::1%eth0]:80", true},
		{"open policy, AWS IPv6 metadata", open, "[fd00:ec2::254]:80", true},
		{"nets, inside", nets, "10.9.8.7:443", false},
		{"nets, inside IPv6", nets, "[fd12::5]:443", false},
		{"nets, outside", nets, "127.0.0.1:443", true},
		{"nets never allow metadata", Policy{Nets: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, "169.254.169.254:80", true},
		{"garbage", open, "not-an-address", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.policy.Control("tcp", tc.address, nil)
			if (err != nil) != tc.denied {
				t.Fatalf("Control(%s) = %v, want denied=%v", tc.address, err, tc.denied)
			}
			var d *DeniedError
			if err != nil && !errors.As(err, &d) {
				t.Fatalf("error %T is not a DeniedError", err)
			}
		})
	}
}

func TestAllow(t *testing.T) {
	a, err := ParseAllow([]string{"s3.example.com", "*.storage.example.org", "10.0.0.0/8", "192.168.5.5", " "})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host     string
		err      bool
		wantNets bool
	}{
		{"s3.example.com", false, false},
		{"S3.Example.COM.", false, false},
		{"bucket.storage.example.org", false, false},
		{"storage.example.org.evil.com", false, true},
		{"other.example.com", false, true},
		{"metadata.google.internal", true, false},
		{"169.254.169.254", true, false},
	} {
		t.Run(tc.host, func(t *testing.T) {
			p, err := a.Policy(tc.host)
			if (err != nil) != tc.err {
				t.Fatalf("Policy(%s) = %v, want error=%v", tc.host, err, tc.err)
			}
			if (len(p.Nets) > 0) != tc.wantNets {
				t.Fatalf("Policy(%s) nets %v, want restricted=%v", tc.host, p.Nets, tc.wantNets)
			}
		})
	}
	hostsOnly, _ := ParseAllow([]string{"s3.example.com"})
	if _, err := hostsOnly.Policy("evil.example.net"); err == nil {
		t.Fatal("a host outside a names-only list was allowed")
	}
	if _, err := (Allow{Any: true}).Policy("anything.example.net"); err != nil {
		t.Fatalf("\"*\" refused a host: %v", err)
	}
	for _, bad := range []string{"10.0.0.0/33", "s3.example.com:9000", "a*.example.com", "[::1]"} {
		if _, err := ParseAllow([]string{bad}); err == nil {
			t.Errorf("ParseAllow(%q) accepted", bad)
		}
	}
}

// Tenants fail closed: an empty list refuses every endpoint, naming the flag; "*" allows any
// endpoint that is not Forbidden; a listed network allows only itself.
func TestAllowFailsClosed(t *testing.T) {
	var empty Allow
	if _, err := empty.Policy("s3.example.com"); err == nil || !strings.Contains(err.Error(), "--tenant-s3-endpoints") {
		t.Fatalf("empty list: got %v, want a refusal naming --tenant-s3-endpoints", err)
	}
	anyList, err := ParseAllow([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anyList.Policy("s3.example.com"); err != nil {
		t.Fatalf("*: %v", err)
	}
	if _, err := anyList.Policy("169.254.169.254"); err == nil {
		t.Fatal("*: metadata address allowed")
	}
	nets, err := ParseAllow([]string{"127.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := nets.Policy("127.0.0.1"); err != nil || len(p.Nets) != 1 {
		t.Fatalf("listed network: %v %v", p, err)
	}
}
