// Package datasource stages datasets (S3 prefixes, NFS exports, node-local directories) into a
// per-node, per-pool cache, and fills volumes from it. The driver creates one Manager per node;
// the volume service (pkg/volume) uses it through Datasets (Prepare, Fill, Serve, Unserve), with
// pool names and datasets that pkg/params parsed. The Manager is the coordinator of the parts
// under it (docs/datasets.md, "The parts of the data engine"): cache/, stage/, access/, peer/.
package datasource

import (
	"github.com/cistern-csi/cistern/pkg/datasource/dataset"
)

// The shared vocabulary lives in package dataset; these names keep the package's API.
type (
	Scheme      = dataset.Scheme
	Spec        = dataset.Spec
	Credentials = dataset.Credentials
	Limits      = dataset.Limits
)

const (
	SchemeS3    = dataset.SchemeS3
	SchemeNFS   = dataset.SchemeNFS
	SchemeLocal = dataset.SchemeLocal

	SecretAccessKeyID     = dataset.SecretAccessKeyID
	SecretSecretAccessKey = dataset.SecretSecretAccessKey
	SecretSessionToken    = dataset.SecretSessionToken
)

// DefaultLimits are the limits a zero Config field gets, and the driver flags' defaults.
var DefaultLimits = dataset.DefaultLimits

// SpecOf wraps a parsed dataset; nil stays nil.
var SpecOf = dataset.SpecOf

// CredentialsFromSecrets reads the CSI secrets map; see dataset.CredentialsFromSecrets.
var CredentialsFromSecrets = dataset.CredentialsFromSecrets
