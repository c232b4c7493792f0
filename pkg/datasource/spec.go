// Package datasource stages datasets (S3 prefixes, NFS exports, node-local directories) into a
// per-node, per-pool cache, and fills volumes from it. The driver creates one Manager per node
// and calls ParseParams, Ensure/Wait, Populate, TreePath and Acquire/Release.
package datasource

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Scheme names a source type.
type Scheme string

const (
	SchemeS3    Scheme = "s3"
	SchemeNFS   Scheme = "nfs"
	SchemeLocal Scheme = "file"
)

// Spec is a validated dataset description. It never holds credentials.
type Spec struct {
	Source    string   `json:"source"`
	Scheme    Scheme   `json:"scheme"`
	Endpoint  string   `json:"endpoint,omitempty"`
	Region    string   `json:"region,omitempty"`
	PathStyle bool     `json:"pathStyle,omitempty"`
	Include   []string `json:"include,omitempty"`
	Exclude   []string `json:"exclude,omitempty"`

	// Parsed source location.
	Bucket string `json:"-"` // s3
	Prefix string `json:"-"` // s3: key prefix ending in "/" or empty
	Host   string `json:"-"` // nfs: host or host:port
	Path   string `json:"-"` // nfs: export path and subpath; file: absolute node path

	// Inline is set for the volume attributes of an inline ephemeral volume, which any pod author
	// writes: the manager admits only the NFS servers the administrator allows there.
	Inline bool `json:"-"`
	// Tenant marks a dataset a pod author named (an inline volume, a VolumeManager): its S3
	// endpoint must be in the administrator's allow-list (Config.TenantEndpoints). The caller
	// sets it; it is kept with a staging job (a resumed one stays restricted) but is not part of
	// the dataset's identity.
	Tenant bool `json:"tenant,omitempty"`
}

// Credentials come from a CSI secret; empty means anonymous access.
type Credentials struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
}

// Secret keys read by CredentialsFromSecrets.
const (
	SecretAccessKeyID     = "accessKeyID"
	SecretSecretAccessKey = "secretAccessKey"
	SecretSessionToken    = "sessionToken"
)

// CredentialsFromSecrets reads the CSI secrets map. Other keys are ignored; a half-filled pair
// is an error so a typo does not silently become anonymous access.
func CredentialsFromSecrets(secrets map[string]string) (Credentials, error) {
	c := Credentials{
		AccessKeyID:     secrets[SecretAccessKeyID],
		SecretAccessKey: secrets[SecretSecretAccessKey],
		SessionToken:    secrets[SecretSessionToken],
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return Credentials{}, source.Errorf(source.Invalid,
			"dataset secret must hold both %s and %s, or neither", SecretAccessKeyID, SecretSecretAccessKey)
	}
	return c, nil
}

// String is safe to log.
func (c Credentials) String() string {
	if c.AccessKeyID == "" {
		return "anonymous"
	}
	return "static credentials"
}

// IsParam reports whether key is a dataset parameter.
func IsParam(key string) bool {
	switch key {
	case consts.ParamSource, consts.ParamEndpoint, consts.ParamRegion, consts.ParamPathStyle,
		consts.ParamInclude, consts.ParamExclude:
		return true
	}
	return false
}

// otherParam reports keys the driver owns, which ParseParams accepts without looking at them.
func otherParam(key string) bool {
	return key == consts.ParamPool || key == consts.ParamPoolSelector ||
		strings.HasPrefix(key, consts.ReservedParamPrefix)
}

// ParseParams validates the dataset parameters of a StorageClass, a static PV's volumeAttributes
// or an inline ephemeral volume's volumeAttributes. It returns (nil, nil) when there is no
// `source`. Unknown keys are refused by name, except the driver's own (pool, poolSelector,
// csi.storage.k8s.io/*); a driver with more keys passes only the ones it does not handle.
// Ephemeral volumes may not use file:// sources: any pod author writes them.
func ParseParams(params map[string]string, ephemeral bool) (*Spec, error) {
	var unknown []string
	for k := range params {
		if !IsParam(k) && !otherParam(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, source.Errorf(source.Invalid, "unknown parameter(s) %s", strings.Join(unknown, ", "))
	}
	raw, ok := params[consts.ParamSource]
	if !ok {
		for k := range params {
			if IsParam(k) {
				return nil, source.Errorf(source.Invalid, "parameter %q needs %q", k, consts.ParamSource)
			}
		}
		return nil, nil
	}
	s := &Spec{Source: raw, Endpoint: params[consts.ParamEndpoint], Region: params[consts.ParamRegion]}
	if v, ok := params[consts.ParamPathStyle]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, source.Errorf(source.Invalid, "parameter %s=%q is not true or false", consts.ParamPathStyle, v)
		}
		s.PathStyle = b
	}
	var err error
	if s.Include, err = source.ParsePatterns(params[consts.ParamInclude]); err != nil {
		return nil, err
	}
	if s.Exclude, err = source.ParsePatterns(params[consts.ParamExclude]); err != nil {
		return nil, err
	}
	if err := s.parseSource(ephemeral); err != nil {
		return nil, err
	}
	s.Inline = ephemeral
	return s, nil
}

func (s *Spec) parseSource(ephemeral bool) error {
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
	case SchemeNFS, SchemeLocal:
		if s.Endpoint != "" || s.Region != "" || s.PathStyle {
			return source.Errorf(source.Invalid, "endpoint, region and pathStyle apply to s3:// sources only")
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
			if ephemeral {
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
func (s *Spec) ID() string {
	// Canonical fields only: "s3://b/p" and "s3://b/p/" are one dataset.
	b, _ := json.Marshal([]any{s.Scheme, s.Bucket, s.Prefix, s.Host, s.Path, s.Endpoint, s.Region,
		s.PathStyle, s.Include, s.Exclude})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// String is safe to log.
func (s *Spec) String() string {
	out := s.Source
	if s.Endpoint != "" {
		out += " via " + s.Endpoint
	}
	return out
}

// Filter returns the include/exclude filter.
func (s *Spec) Filter() source.Filter { return source.Filter{Include: s.Include, Exclude: s.Exclude} }

func (s *Spec) describe() string { return fmt.Sprintf("dataset %s", s.Source) }
