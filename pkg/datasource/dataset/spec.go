// Package dataset is the vocabulary every part of the data engine shares: a dataset as a volume
// names it (Spec), the caller's credentials, and the limits one dataset may make a node spend.
package dataset

import (
	"fmt"
	"net/url"

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
	// Namespace is the caller's namespace (the pod's, the claim's, the VolumeManager's), whose
	// share of the node's listing slots its listings take (Limits.ListingsPerNamespace); empty
	// for a caller that names none (an administrator's volume staged before any pod). The
	// caller sets it; it is neither part of the dataset's identity nor kept.
	Namespace string `json:"-"`
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
	// CurrentToken, when set, gives the pod's newest token at each STS exchange of the reads
	// made with these credentials (kubelet renews it at every NodePublishVolume): a staging or a
	// streaming volume outlives the token its request brought. WebIdentityToken is that one,
	// which names the request's principal.
	CurrentToken IdentityToken
}

// IdentityToken gives a web identity's current token (stscreds.IdentityTokenRetriever).
type IdentityToken interface {
	GetIdentityToken() ([]byte, error)
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

// Describe names the dataset in messages: "dataset <source>".
func (s *Spec) Describe() string { return fmt.Sprintf("dataset %s", s.Source) }

// awsHost stands for AWS S3 (a source without an endpoint) in the endpoint allow-list:
// "*.amazonaws.com" allows it.
const awsHost = "s3.amazonaws.com"

// EndpointHost is the host an S3 source's requests go to, for the endpoint checks.
func (s *Spec) EndpointHost() string {
	if s.Endpoint == "" {
		return awsHost
	}
	u, err := url.Parse(s.Endpoint)
	if err != nil {
		return s.Endpoint
	}
	return u.Hostname()
}
