package datasource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// DefaultWebIdentityAudience is the audience of the ServiceAccount tokens exchanged for a role's
// keys (consts.DefaultWebIdentityAudience).
const DefaultWebIdentityAudience = consts.DefaultWebIdentityAudience

// Credentials returns the credentials a request brings for spec: the CSI secret's keys, or, for
// a dataset with credentials=webIdentity, the pod's ServiceAccount token for the configured
// audience (kubelet puts it in NodePublishVolume's volume context when the CSIDriver requests
// it), to be exchanged for the role's keys, with the pod's holder that later calls renew
// (podtokens.go). NodeStageVolume has no pod and so no token: a claim's volume waits for its
// first publish (pkg/volume, webidentity.go), and a static PV's dataset, which is staged there,
// is refused with InvalidArgument.
func (d *Datasets) Credentials(ctx context.Context, spec *Spec, secrets, volumeContext map[string]string) (Credentials, error) {
	if spec == nil || spec.Credentials != consts.CredentialsWebIdentity {
		return CredentialsFromSecrets(secrets)
	}
	audience := d.m.audience()
	token, err := podTokenFor(volumeContext, audience)
	_, passed := volumeContext[consts.VolumeContextSATokens]
	switch {
	case errors.Is(err, errNoToken) && !passed:
		return Credentials{}, source.Errorf(source.Invalid, "%s uses web-identity credentials, which need the pod's ServiceAccount token: kubelet passes none here (the CSIDriver's tokenRequests must name audience %q; a static PV's dataset is staged before any pod: use a StorageClass or an inline volume)", spec.Describe(), audience)
	case errors.Is(err, errNoToken):
		return Credentials{}, source.Errorf(source.Invalid, "%s uses web-identity credentials, but kubelet passed no token for audience %q: add it to the CSIDriver's tokenRequests", spec.Describe(), audience)
	case err != nil:
		return Credentials{}, err
	}
	role, err := d.m.webIdentityRole(ctx, spec, volumeContext)
	if err != nil {
		return Credentials{}, err
	}
	c := Credentials{RoleARN: role, WebIdentityToken: token,
		SessionName: volumeContext[consts.VolumeContextPodNamespace] + "." + volumeContext[consts.VolumeContextPodName]}
	if pod := PodOf(volumeContext); pod != "" {
		c.CurrentToken = d.m.tokens.hold(pod, token)
	}
	return c, nil
}

// audience is the audience of the tokens web-identity datasets exchange.
func (m *Manager) audience() string {
	if m.cfg.WebIdentityAudience != "" {
		return m.cfg.WebIdentityAudience
	}
	return DefaultWebIdentityAudience
}

// ProofInputs returns what Credentials reads of secrets and of the volume context's tokens, and
// nothing else: what a process that takes a streaming volume over needs to prove its caller's
// access again (pkg/volume keeps it in the FUSE keeper's memory). The secret's other keys, and
// tokens for other audiences, are left out, so a pod's large secret costs the keeper nothing.
// Called after Credentials accepted the same inputs.
func (d *Datasets) ProofInputs(spec *Spec, secrets, volumeContext map[string]string) (map[string]string, string) {
	if spec == nil || spec.Credentials != consts.CredentialsWebIdentity {
		kept := map[string]string{}
		for _, k := range []string{SecretAccessKeyID, SecretSecretAccessKey, SecretSessionToken} {
			if v, ok := secrets[k]; ok {
				kept[k] = v
			}
		}
		return kept, ""
	}
	return nil, d.ProofToken(volumeContext)
}

// ProofToken is, of kubelet's csi.storage.k8s.io/serviceAccount.tokens in volumeContext, the
// token of the web identity's audience alone, in kubelet's JSON: what a web-identity proof reads.
// "" when there is none.
func (d *Datasets) ProofToken(volumeContext map[string]string) string {
	audience := d.m.audience()
	t, err := podTokenFor(volumeContext, audience)
	if err != nil {
		return ""
	}
	b, _ := json.Marshal(map[string]saToken{audience: {Token: t}})
	return string(b)
}

// ServiceAccountRoles reads the role a ServiceAccount names for its pods' web-identity datasets
// (consts.AnnotationRoleARN, else consts.AnnotationEKSRoleARN); "" when it names none. Errors are
// source errors (pkg/sarole reads them from the API server).
type ServiceAccountRoles interface {
	RoleARN(ctx context.Context, namespace, name string) (string, error)
}

// webIdentityRole is the role a web-identity dataset takes: its roleARN, or with
// roleFrom=serviceAccount the one the publishing pod's ServiceAccount names (kubelet names the
// ServiceAccount, podInfoOnMount). Which role is asked for is not the trust decision: the STS
// gives its keys only to the ServiceAccounts the role's trust policy names, so a pod author who
// annotates their ServiceAccount with another team's role is refused there. The administrator
// may also bound the roles asked for (WebIdentityRoles); a role outside them is Denied.
func (m *Manager) webIdentityRole(ctx context.Context, spec *Spec, volumeContext map[string]string) (string, error) {
	role := spec.RoleARN
	if spec.RoleFrom == consts.RoleFromServiceAccount {
		ns, sa := volumeContext[consts.VolumeContextPodNamespace], volumeContext[consts.VolumeContextSAName]
		switch {
		case ns == "" || sa == "":
			return "", source.Errorf(source.Invalid, "%s takes its role from the pod's ServiceAccount, but kubelet named none: the CSIDriver needs podInfoOnMount", spec.Describe())
		case m.cfg.ServiceAccountRoles == nil:
			return "", source.Errorf(source.Invalid, "%s takes its role from the pod's ServiceAccount, which this node plugin cannot read: it has no API access (in-cluster, or --kubeconfig)", spec.Describe())
		}
		r, err := m.cfg.ServiceAccountRoles.RoleARN(ctx, ns, sa)
		if err != nil {
			return "", fmt.Errorf("%s: %w", spec.Describe(), err)
		}
		if r == "" {
			return "", source.Errorf(source.Invalid, "%s takes its role from the pod's ServiceAccount %s/%s, which has no annotation %s (or %s)",
				spec.Describe(), ns, sa, consts.AnnotationRoleARN, consts.AnnotationEKSRoleARN)
		}
		role = r
	}
	allowed := len(m.cfg.WebIdentityRoles) == 0 || slices.ContainsFunc(m.cfg.WebIdentityRoles, func(p string) bool {
		ok, _ := path.Match(p, role)
		return ok
	})
	if !allowed {
		return "", source.Errorf(source.Denied, "%s: role %s is not one web-identity datasets may take on this node (the administrator allows %s with --web-identity-roles)",
			spec.Describe(), role, strings.Join(m.cfg.WebIdentityRoles, ", "))
	}
	return role, nil
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
	var token stscreds.IdentityTokenRetriever = s3source.StaticToken(c.WebIdentityToken)
	if c.CurrentToken != nil {
		token = c.CurrentToken
	}
	return &s3source.WebIdentity{RoleARN: c.RoleARN, Token: token, STSEndpoint: m.cfg.STSEndpoint, SessionName: name}
}
