package datasource

import (
	"encoding/json"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// DefaultWebIdentityAudience is the audience of the ServiceAccount tokens exchanged for a role's
// keys (consts.DefaultWebIdentityAudience).
const DefaultWebIdentityAudience = consts.DefaultWebIdentityAudience

// saToken is one entry of kubelet's csi.storage.k8s.io/serviceAccount.tokens.
type saToken struct {
	Token string `json:"token"`
}

// Credentials returns the credentials a request brings for spec: the CSI secret's keys, or, for
// a dataset with credentials=webIdentity, the pod's ServiceAccount token for the configured
// audience (kubelet puts it in NodePublishVolume's volume context when the CSIDriver requests
// it), to be exchanged for the role's keys. NodeStageVolume has no pod and so no token: a
// claim's volume waits for its first publish (pkg/volume, webidentity.go), and a static PV's
// dataset, which is staged there, is refused with InvalidArgument.
func (d *Datasets) Credentials(spec *Spec, secrets, volumeContext map[string]string) (Credentials, error) {
	if spec == nil || spec.Credentials != consts.CredentialsWebIdentity {
		return CredentialsFromSecrets(secrets)
	}
	audience := d.m.cfg.WebIdentityAudience
	if audience == "" {
		audience = DefaultWebIdentityAudience
	}
	raw, ok := volumeContext[consts.VolumeContextSATokens]
	if !ok {
		return Credentials{}, source.Errorf(source.Invalid, "%s uses web-identity credentials, which need the pod's ServiceAccount token: kubelet passes none here (the CSIDriver's tokenRequests must name audience %q; a static PV's dataset is staged before any pod: use a StorageClass or an inline volume)", spec.Describe(), audience)
	}
	var tokens map[string]saToken
	if err := json.Unmarshal([]byte(raw), &tokens); err != nil {
		return Credentials{}, source.Errorf(source.Invalid, "the volume context's %s is not kubelet's JSON", consts.VolumeContextSATokens)
	}
	t, ok := tokens[audience]
	if !ok || t.Token == "" {
		return Credentials{}, source.Errorf(source.Invalid, "%s uses web-identity credentials, but kubelet passed no token for audience %q: add it to the CSIDriver's tokenRequests", spec.Describe(), audience)
	}
	return Credentials{RoleARN: spec.RoleARN, WebIdentityToken: t.Token,
		SessionName: volumeContext["csi.storage.k8s.io/pod.namespace"] + "." + volumeContext["csi.storage.k8s.io/pod.name"]}, nil
}

// webIdentity is the s3source configuration of web-identity credentials; nil for others.
func (m *Manager) webIdentity(c Credentials) *s3source.WebIdentity {
	if c.RoleARN == "" {
		return nil
	}
	name := c.SessionName
	if len(name) > 64 { // STS's limit on a session name
		name = name[:64]
	}
	if name == "." || name == "" {
		name = "cistern"
	}
	return &s3source.WebIdentity{RoleARN: c.RoleARN, Token: c.WebIdentityToken, STSEndpoint: m.cfg.STSEndpoint, SessionName: name}
}
