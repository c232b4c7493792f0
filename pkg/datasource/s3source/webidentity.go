package s3source

import (
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// WebIdentity is a pod's own S3 identity: its ServiceAccount token (kubelet hands it to
// NodePublishVolume for the audience the CSIDriver requests), exchanged at an STS with
// AssumeRoleWithWebIdentity for short-lived keys of a role. No Secret holds a key, and the STS,
// not the node, decides whether the pod's ServiceAccount may take the role.
type WebIdentity struct {
	// RoleARN is the role to assume; the role's trust policy names the ServiceAccounts it trusts.
	RoleARN string
	// Token gives the pod's ServiceAccount token (a JWT of the cluster's issuer) at each
	// exchange: the keys are renewed before they expire, and the token they were exchanged
	// for may have expired by then (kubelet's last for an hour), so a holder that kubelet's
	// republishes renew (pkg/datasource, webidentity.go) keeps a long read going; StaticToken
	// for one that is not renewed.
	Token stscreds.IdentityTokenRetriever
	// STSEndpoint is the STS to ask (the administrator's flag); empty: AWS STS of the region.
	STSEndpoint string
	// SessionName names the session in the STS's and the S3 server's logs (the pod).
	SessionName string
}

// webIdentityDuration is how long the keys of one exchange last; the cache renews them before.
const webIdentityDuration = time.Hour

// credentials is the provider of a web identity's keys, asked of the STS through hc (the same
// egress policy and trust as the S3 client), cached and renewed before they expire.
func (w *WebIdentity) credentials(region string, hc *http.Client) aws.CredentialsProvider {
	opts := sts.Options{Region: region, HTTPClient: hc, Credentials: aws.AnonymousCredentials{}}
	if w.STSEndpoint != "" {
		opts.BaseEndpoint = aws.String(w.STSEndpoint)
	}
	p := stscreds.NewWebIdentityRoleProvider(sts.New(opts), w.RoleARN, w.Token, func(o *stscreds.WebIdentityRoleOptions) {
		o.RoleSessionName = w.SessionName
		o.Duration = webIdentityDuration
	})
	return aws.NewCredentialsCache(p, func(o *aws.CredentialsCacheOptions) { o.ExpiryWindow = 5 * time.Minute })
}

// StaticToken is a token that is not renewed: the keys of the exchanges after it expired are
// refused.
type StaticToken string

func (t StaticToken) GetIdentityToken() ([]byte, error) { return []byte(t), nil }
