package testpeers

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// OIDCIssuer stands for a cluster's ServiceAccount issuer: OIDC discovery and a JWKS of one RSA
// key, and tokens it signs as kube-apiserver signs ServiceAccount tokens (RS256, iss, sub
// system:serviceaccount:<ns>:<name>, aud, exp).
type OIDCIssuer struct {
	URL string
	key *rsa.PrivateKey
}

// StartOIDCIssuer serves discovery and JWKS on loopback until the test ends.
func StartOIDCIssuer(t testing.TB) *OIDCIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	iss := &OIDCIssuer{key: key}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"issuer": iss.URL, "jwks_uri": iss.URL + "/openid/v1/jwks",
			"id_token_signing_alg_values_supported": []string{"RS256"}})
	})
	mux.HandleFunc("/openid/v1/jwks", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
			"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1",
			"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
		}}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	iss.URL = srv.URL
	return iss
}

// Token is a ServiceAccount token of namespace/name for audience, valid for an hour.
func (i *OIDCIssuer) Token(t testing.TB, serviceAccount, audience string) string {
	t.Helper()
	ns, name, _ := strings.Cut(serviceAccount, "/")
	return signJWT(t, i.key, map[string]any{
		"iss": i.URL, "sub": "system:serviceaccount:" + ns + ":" + name, "aud": []string{audience},
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	})
}

// ForgedToken is a token of the same claims signed by a key the issuer never published.
func (i *OIDCIssuer) ForgedToken(t testing.TB, serviceAccount, audience string) string {
	t.Helper()
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	forger := &OIDCIssuer{URL: i.URL, key: other}
	return forger.Token(t, serviceAccount, audience)
}

func signJWT(t testing.TB, key *rsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	h, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "k1"})
	c, _ := json.Marshal(claims)
	signed := b64(h) + "." + b64(c)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + b64(sig)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// Role is what the test STS hands out: the S3 keys of the role, to the ServiceAccounts its trust
// policy names. The answer carries no session token: versitygw refuses one it did not issue.
type Role struct {
	// Trusts are the token subjects (system:serviceaccount:<ns>:<name>) that may take the role.
	Trusts               []string
	AccessKey, SecretKey string
}

// STS is an AssumeRoleWithWebIdentity endpoint as AWS STS answers it, for an OIDC issuer: it
// verifies the token against the issuer's discovery document and JWKS (signature, issuer,
// audience, expiry), checks the role trusts the token's subject, and answers with the role's keys.
type STS struct {
	URL string
	// Exchanges counts the tokens exchanged for keys.
	Exchanges func() int
}

// StartSTS serves the STS on loopback until the test ends.
func StartSTS(t testing.TB, issuerURL, audience string, roles map[string]Role) *STS {
	t.Helper()
	var n int
	var mu = make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "AssumeRoleWithWebIdentity" {
			stsError(w, http.StatusBadRequest, "InvalidAction", "only AssumeRoleWithWebIdentity")
			return
		}
		sub, err := verifyToken(issuerURL, audience, r.Form.Get("WebIdentityToken"))
		if err != nil {
			stsError(w, http.StatusBadRequest, "InvalidIdentityToken", err.Error())
			return
		}
		role, ok := roles[r.Form.Get("RoleArn")]
		if !ok || !slices.Contains(role.Trusts, sub) {
			stsError(w, http.StatusForbidden, "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity")
			return
		}
		mu <- struct{}{}
		n++
		<-mu
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><SubjectFromWebIdentityToken>%s</SubjectFromWebIdentityToken>
<Credentials><AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey>
<Expiration>%s</Expiration></Credentials></AssumeRoleWithWebIdentityResult>
<ResponseMetadata><RequestId>test</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>`,
			xmlEscape(sub), xmlEscape(role.AccessKey), xmlEscape(role.SecretKey), time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &STS{URL: srv.URL, Exchanges: func() int { mu <- struct{}{}; defer func() { <-mu }(); return n }}
}

func stsError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>test</RequestId></ErrorResponse>`,
		code, xmlEscape(msg))
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// verifyToken checks an RS256 JWT against the issuer's published keys and returns its subject.
func verifyToken(issuerURL, audience, token string) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("not a JWT")
	}
	var disc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := getJSON(issuerURL+"/.well-known/openid-configuration", &disc); err != nil {
		return "", err
	}
	var jwks struct {
		Keys []struct{ Kty, N, E string } `json:"keys"`
	}
	if err := getJSON(disc.JWKSURI, &jwks); err != nil {
		return "", err
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	verified := false
	for _, k := range jwks.Keys {
		n, err1 := base64.RawURLEncoding.DecodeString(k.N)
		e, err2 := base64.RawURLEncoding.DecodeString(k.E)
		if k.Kty != "RSA" || err1 != nil || err2 != nil {
			continue
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		if rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig) == nil {
			verified = true
			break
		}
	}
	if !verified {
		return "", fmt.Errorf("signature not verified by the issuer's keys")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", err
	}
	var c struct {
		Iss string   `json:"iss"`
		Sub string   `json:"sub"`
		Aud []string `json:"aud"`
		Exp int64    `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "", err
	}
	switch {
	case c.Iss != disc.Issuer:
		return "", fmt.Errorf("issuer %q is not %q", c.Iss, disc.Issuer)
	case !slices.Contains(c.Aud, audience):
		return "", fmt.Errorf("audience %v is not %q", c.Aud, audience)
	case time.Now().Unix() >= c.Exp:
		return "", fmt.Errorf("token expired")
	}
	return c.Sub, nil
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
