package datasource

import (
	"net/url"

	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// awsHost stands for AWS S3 (a source without an endpoint) in the endpoint allow-list:
// "*.amazonaws.com" allows it.
const awsHost = "s3.amazonaws.com"

// endpointHost is the host an S3 source's requests go to, for the endpoint checks.
func (s *Spec) endpointHost() string {
	if s.Endpoint == "" {
		return awsHost
	}
	u, err := url.Parse(s.Endpoint)
	if err != nil {
		return s.Endpoint
	}
	return u.Hostname()
}

// CheckEndpoint refuses, with a Denied error, an S3 endpoint that names a cloud metadata
// service or link-local address, and a tenant's endpoint outside the administrator's
// allow-list (Config.TenantEndpoints). Addresses a name resolves to are checked again on
// every connection (egressPolicy).
func (m *Manager) CheckEndpoint(spec *Spec) error {
	_, err := m.egressPolicy(spec)
	return err
}

// egressPolicy is what the source of spec may connect to.
func (m *Manager) egressPolicy(spec *Spec) (egress.Policy, error) {
	if spec.Scheme != SchemeS3 {
		return egress.Policy{}, nil
	}
	host := spec.endpointHost()
	var (
		p   egress.Policy
		err = egress.ForbiddenHost(host)
	)
	if err == nil && spec.Tenant {
		p, err = m.cfg.TenantEndpoints.Policy(host)
	}
	if err != nil {
		return egress.Policy{}, source.Wrap(source.Denied, err, "%s: endpoint refused", spec.describe())
	}
	return p, nil
}
