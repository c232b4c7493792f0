package datasource

import (
	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

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
	host := spec.EndpointHost()
	var (
		p   egress.Policy
		err = egress.ForbiddenHost(host)
	)
	if err == nil && spec.Tenant {
		p, err = m.cfg.TenantEndpoints.Policy(host)
	}
	if err != nil {
		return egress.Policy{}, source.Wrap(source.Denied, err, "%s: endpoint refused", spec.Describe())
	}
	return p, nil
}
