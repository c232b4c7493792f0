package params

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Scheme names a source type.
type Scheme string

const (
	SchemeS3    Scheme = "s3"
	SchemeNFS   Scheme = "nfs"
	SchemeLocal Scheme = "file"
)

// Dataset is a validated dataset description. It never holds credentials.
type Dataset struct {
	Source    string `json:"source"`
	Scheme    Scheme `json:"scheme"`
	Endpoint  string `json:"endpoint,omitempty"`
	Region    string `json:"region,omitempty"`
	PathStyle bool   `json:"pathStyle,omitempty"`
	// CABundle names the administrator's CA bundle that verifies an https endpoint. It is not
	// part of the dataset's identity: the data is the same whoever vouches for the server.
	CABundle string `json:"caBundle,omitempty"`
	// Credentials is "webIdentity" when the keys come from the pod's ServiceAccount token
	// exchanged for RoleARN's (the STS decides whether the pod's ServiceAccount may take the
	// role); empty: from the CSI secret. Neither is part of the dataset's identity.
	Credentials string `json:"credentials,omitempty"`
	RoleARN     string `json:"roleARN,omitempty"`
	// RoleFrom "serviceAccount" takes the role from the publishing pod's ServiceAccount
	// annotation instead of RoleARN (the STS still decides whether that ServiceAccount may
	// take it).
	RoleFrom string `json:"roleFrom,omitempty"`
	// NFSVersion is "4" for an nfs:// dataset read over NFSv4, its path in the server's NFSv4
	// namespace; empty for NFSv3.
	NFSVersion string   `json:"nfsVersion,omitempty"`
	Include    []string `json:"include,omitempty"`
	Exclude    []string `json:"exclude,omitempty"`

	// Parsed source location.
	Bucket string `json:"-"` // s3
	Prefix string `json:"-"` // s3: key prefix ending in "/" or empty
	Host   string `json:"-"` // nfs: host or host:port
	Path   string `json:"-"` // nfs: export path and subpath; file: absolute node path

	// Inline is set for the volume attributes of an inline ephemeral volume, which any pod author
	// writes: the manager admits only the NFS servers the administrator allows there.
	Inline bool `json:"-"`
}

// parseSource checks the source URL and the options that go with its scheme. Inline volumes may
// not use file:// sources: any pod author writes them.
func (s *Dataset) parseSource(inline bool) error {
	u, err := url.Parse(s.Source)
	if err != nil {
		return source.Errorf(source.Invalid, "source %q is not a URL", s.Source)
	}
	if u.User != nil {
		return source.Errorf(source.Invalid, "source must not embed credentials; use the node-stage secret")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return source.Errorf(source.Invalid, "source %q must not have a query or fragment", s.Source)
	}
	s.Scheme = Scheme(u.Scheme)
	switch s.Scheme {
	case SchemeS3:
		if u.Host == "" {
			return source.Errorf(source.Invalid, "source %q names no bucket", s.Source)
		}
		s.Bucket = u.Host
		p := strings.TrimPrefix(u.Path, "/")
		if p != "" {
			if err := source.ValidateKey(strings.TrimSuffix(p, "/")); err != nil {
				return source.Wrap(source.Invalid, err, "source prefix")
			}
			p = strings.TrimSuffix(p, "/") + "/"
		}
		s.Prefix = p
		if s.Endpoint != "" {
			e, err := url.Parse(s.Endpoint)
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return source.Errorf(source.Invalid, "endpoint %q is not an http(s) URL", s.Endpoint)
			}
			if e.User != nil {
				return source.Errorf(source.Invalid, "endpoint must not embed credentials")
			}
		}
		if s.CABundle != "" && !strings.HasPrefix(s.Endpoint, "https://") {
			return source.Errorf(source.Invalid, "caBundle needs an https:// endpoint")
		}
		if (s.Credentials == "webIdentity") != (s.RoleARN != "" || s.RoleFrom != "") {
			return source.Errorf(source.Invalid, "credentials=webIdentity goes with roleARN or roleFrom=serviceAccount, and they with it")
		}
		if s.RoleARN != "" && s.RoleFrom != "" {
			return source.Errorf(source.Invalid, "roleARN and roleFrom name the role twice: give one")
		}
	case SchemeNFS, SchemeLocal:
		if s.Endpoint != "" || s.Region != "" || s.PathStyle || s.CABundle != "" || s.Credentials != "" || s.RoleARN != "" || s.RoleFrom != "" {
			return source.Errorf(source.Invalid, "endpoint, region, pathStyle, caBundle, credentials, roleARN and roleFrom apply to s3:// sources only")
		}
		if s.Scheme == SchemeNFS {
			if u.Host == "" {
				return source.Errorf(source.Invalid, "source %q names no server", s.Source)
			}
			if _, port, err := net.SplitHostPort(u.Host); err == nil {
				if _, err := strconv.ParseUint(port, 10, 16); err != nil {
					return source.Errorf(source.Invalid, "source %q has a bad port", s.Source)
				}
			}
			s.Host = u.Host
		} else {
			if inline {
				return source.Errorf(source.Denied, "file:// sources are not allowed in inline ephemeral volumes")
			}
			if u.Host != "" {
				return source.Errorf(source.Invalid, "source %q: file:// URLs take no host (file:///path)", s.Source)
			}
		}
		if !strings.HasPrefix(u.Path, "/") {
			return source.Errorf(source.Invalid, "source %q needs an absolute path", s.Source)
		}
		if p := strings.Trim(u.Path, "/"); p != "" {
			if err := source.ValidateKey(p); err != nil {
				return source.Wrap(source.Invalid, err, "source path")
			}
		}
		s.Path = "/" + strings.Trim(u.Path, "/")
	default:
		return source.Errorf(source.Invalid, "source %q: scheme must be s3, nfs or file", s.Source)
	}
	return nil
}

// ID names the dataset: sources with the same location, endpoint and filters share a cache entry.
func (s *Dataset) ID() string {
	// Canonical fields only: "s3://b/p" and "s3://b/p/" are one dataset.
	// NFSv4 paths are another namespace than NFSv3 exports; NFSv3's IDs stay as they were.
	fields := []any{s.Scheme, s.Bucket, s.Prefix, s.Host, s.Path, s.Endpoint, s.Region,
		s.PathStyle, s.Include, s.Exclude}
	if s.NFSVersion != "" {
		fields = append(fields, "nfsVersion="+s.NFSVersion)
	}
	b, _ := json.Marshal(fields)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// String is safe to log.
func (s *Dataset) String() string {
	out := s.Source
	if s.Endpoint != "" {
		out += " via " + s.Endpoint
	}
	if s.NFSVersion != "" {
		out += " (NFSv" + s.NFSVersion + ")"
	}
	return out
}

// Filter returns the include/exclude filter.
func (s *Dataset) Filter() source.Filter {
	return source.Filter{Include: s.Include, Exclude: s.Exclude}
}
