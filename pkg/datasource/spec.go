// Package datasource stages datasets (S3 prefixes, NFS exports, node-local directories) into a
// per-node, per-pool cache, and fills volumes from it. The driver creates one Manager per node;
// the volume service (pkg/volume) uses it through Datasets (Prepare, Fill, Serve, Unserve), with
// pool names and datasets that pkg/params parsed.
package datasource

import (
	"fmt"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/params"
)

// Scheme names a source type.
type Scheme = params.Scheme

const (
	SchemeS3    = params.SchemeS3
	SchemeNFS   = params.SchemeNFS
	SchemeLocal = params.SchemeLocal
)

// Spec is a dataset as pkg/params parsed it from a volume's parameters; the manager sees only
// these dataset keys, never the driver's.
type Spec struct {
	params.Dataset
	// Tenant marks a dataset a pod author named (an inline volume, a VolumeManager): its S3
	// endpoint must be in the administrator's allow-list (Config.TenantEndpoints). The caller
	// sets it; it is kept with a staging job (a resumed one stays restricted) but is not part of
	// the dataset's identity.
	Tenant bool `json:"tenant,omitempty"`
}

// SpecOf wraps a parsed dataset; nil stays nil.
func SpecOf(d *params.Dataset) *Spec {
	if d == nil {
		return nil
	}
	return &Spec{Dataset: *d}
}

// Credentials come from a CSI secret, or are a pod's web identity (RoleARN set: its
// ServiceAccount token, exchanged at the STS for the role's keys; webidentity.go); empty means
// anonymous access.
type Credentials struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string

	RoleARN, WebIdentityToken string
	// SessionName names the web identity's session (the pod) in the STS's logs.
	SessionName string
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
	if c.RoleARN != "" {
		return "web identity for " + c.RoleARN
	}
	if c.AccessKeyID == "" {
		return "anonymous"
	}
	return "static credentials"
}

func (s *Spec) describe() string { return fmt.Sprintf("dataset %s", s.Source) }
