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
	// Token is the pod's ServiceAccount token (a JWT of the cluster's issuer).
	Token string
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
	p := stscreds.NewWebIdentityRoleProvider(sts.New(opts), w.RoleARN, staticToken(w.Token), func(o *stscreds.WebIdentityRoleOptions) {
		o.RoleSessionName = w.SessionName
		o.Duration = webIdentityDuration
	})
	return aws.NewCredentialsCache(p, func(o *aws.CredentialsCacheOptions) { o.ExpiryWindow = 5 * time.Minute })
}

// staticToken hands the STS the token kubelet gave NodePublishVolume; kubelet gives a fresh one
// on the next call.
type staticToken string

func (t staticToken) GetIdentityToken() ([]byte, error) { return []byte(t), nil }
