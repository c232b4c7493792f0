package testpeers

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
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
	return i.TokenUntil(t, serviceAccount, audience, time.Now().Add(time.Hour))
}

// TokenUntil is Token expiring at exp (kubelet's tokenRequests choose a token's lifetime).
func (i *OIDCIssuer) TokenUntil(t testing.TB, serviceAccount, audience string, exp time.Time) string {
	t.Helper()
	ns, name, _ := strings.Cut(serviceAccount, "/")
	return signJWT(t, i.key, map[string]any{
		"iss": i.URL, "sub": "system:serviceaccount:" + ns + ":" + name, "aud": []string{audience},
		"iat": time.Now().Unix(), "exp": exp.Unix(),
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
	// KeyLifetime is how long the keys of one exchange last (their Expiration); 0: an hour. The
	// SDK exchanges again from five minutes before they expire, so a shorter one makes every S3
	// request of the holder exchange its token first.
	KeyLifetime time.Duration
}

// STS is an AssumeRoleWithWebIdentity endpoint as AWS STS answers it, for an OIDC issuer: it
// verifies the token against the issuer's discovery document and JWKS (signature, issuer,
// audience, expiry), checks the role trusts the token's subject, and answers with the role's keys.
type STS struct {
	URL string
	// Exchanges counts the tokens exchanged for keys; ExchangesOf those of one token.
	Exchanges   func() int
	ExchangesOf func(token string) int
	// AddRole adds (or replaces) a role the STS hands out.
	AddRole func(arn string, role Role)
	// Now is the time the STS checks tokens' expiry against; Advance moves it on by d, so that
	// a test lets tokens expire without waiting for them (the keys it hands out still expire by
	// the wall clock, KeyLifetime after the exchange, as the SDK that holds them reads it).
	Now     func() time.Time
	Advance func(d time.Duration)
}

// Discovery is where an STS reads an issuer's OIDC discovery document: URL (the issuer's URL
// for a public issuer; a cluster's API server, whose issuer name need not resolve) and the
// client it reads with (the API server's CA, no credentials: as an outside party reads it).
type Discovery struct {
	URL    string
	Client *http.Client
}

// StartSTS serves the STS on loopback until the test ends, for the issuer at issuerURL.
func StartSTS(t testing.TB, issuerURL, audience string, roles map[string]Role) *STS {
	t.Helper()
	return StartSTSFor(t, Discovery{URL: issuerURL, Client: http.DefaultClient}, audience, roles)
}

// StartSTSFor serves the STS on loopback until the test ends, verifying tokens by disc.
func StartSTSFor(t testing.TB, disc Discovery, audience string, roles map[string]Role) *STS {
	t.Helper()
	var mu sync.Mutex
	n, of := 0, map[string]int{}
	var skew time.Duration
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(skew) }
	roles = maps.Clone(roles)
	if roles == nil {
		roles = map[string]Role{}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "AssumeRoleWithWebIdentity" {
			stsError(w, http.StatusBadRequest, "InvalidAction", "only AssumeRoleWithWebIdentity")
			return
		}
		sub, err := verifyToken(disc, audience, r.Form.Get("WebIdentityToken"), now())
		if err != nil {
			stsError(w, http.StatusBadRequest, "InvalidIdentityToken", err.Error())
			return
		}
		mu.Lock()
		role, ok := roles[r.Form.Get("RoleArn")]
		mu.Unlock()
		if !ok || !slices.Contains(role.Trusts, sub) {
			stsError(w, http.StatusForbidden, "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity")
			return
		}
		mu.Lock()
		n++
		of[r.Form.Get("WebIdentityToken")]++
		mu.Unlock()
		lifetime := role.KeyLifetime
		if lifetime == 0 {
			lifetime = time.Hour
		}
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><SubjectFromWebIdentityToken>%s</SubjectFromWebIdentityToken>
<Credentials><AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey>
<Expiration>%s</Expiration></Credentials></AssumeRoleWithWebIdentityResult>
<ResponseMetadata><RequestId>test</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>`,
			xmlEscape(sub), xmlEscape(role.AccessKey), xmlEscape(role.SecretKey), time.Now().Add(lifetime).UTC().Format(time.RFC3339))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &STS{
		URL:         srv.URL,
		Exchanges:   func() int { mu.Lock(); defer mu.Unlock(); return n },
		ExchangesOf: func(token string) int { mu.Lock(); defer mu.Unlock(); return of[token] },
		AddRole:     func(arn string, role Role) { mu.Lock(); defer mu.Unlock(); roles[arn] = role },
		Now:         now,
		Advance:     func(d time.Duration) { mu.Lock(); defer mu.Unlock(); skew += d },
	}
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

// verifyToken checks a JWT against the issuer's published keys (RS256 or ES256, as
// kube-apiserver signs with an RSA or a P-256 key), and that it has not expired by now, and
// returns its subject.
func verifyToken(d Discovery, audience, token string, now time.Time) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("not a JWT")
	}
	var disc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := getJSON(d.Client, strings.TrimSuffix(d.URL, "/")+"/.well-known/openid-configuration", &disc); err != nil {
		return "", err
	}
	var jwks struct {
		Keys []jwk `json:"keys"`
	}
	if err := getJSON(d.Client, disc.JWKSURI, &jwks); err != nil {
		return "", err
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if !slices.ContainsFunc(jwks.Keys, func(k jwk) bool { return k.verifies(sum[:], sig) }) {
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
	case now.Unix() >= c.Exp:
		return "", fmt.Errorf("token expired")
	}
	return c.Sub, nil
}

// jwk is one public key of a JWKS.
type jwk struct{ Kty, N, E, Crv, X, Y string }

// verifies is true when the key's signature over the SHA-256 digest sum is sig.
func (k jwk) verifies(sum, sig []byte) bool {
	num := func(s string) *big.Int {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			return nil
		}
		return new(big.Int).SetBytes(b)
	}
	switch {
	case k.Kty == "RSA":
		n, e := num(k.N), num(k.E)
		return n != nil && e != nil && rsa.VerifyPKCS1v15(&rsa.PublicKey{N: n, E: int(e.Int64())}, crypto.SHA256, sum, sig) == nil
	case k.Kty == "EC" && k.Crv == "P-256" && len(sig) == 64:
		x, err1 := base64.RawURLEncoding.DecodeString(k.X)
		y, err2 := base64.RawURLEncoding.DecodeString(k.Y)
		if err1 != nil || err2 != nil || len(x) != 32 || len(y) != 32 {
			return false
		}
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
		return err == nil && ecdsa.Verify(pub, sum, new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:]))
	}
	return false
}

func getJSON(c *http.Client, url string, v any) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
