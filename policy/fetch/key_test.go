package fetch

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/bundletest"
)

func writeKey(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func pemPublic(t *testing.T, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// TestLoadKey: the algorithm follows from the key where it can, a key
// that cannot verify the algorithm named is refused at once, and so are a
// private key, an unknown algorithm and an HMAC secret without one.
func TestLoadKey(t *testing.T) {
	rsaKey, ecKey := bundletest.RSAKey(t), bundletest.ECKey(t)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good := []struct {
		name string
		k    KeyOptions
		alg  string
	}{
		{"RSA", KeyOptions{File: writeKey(t, rsaKey.Public)}, "RS256"},
		{"RSA PS384", KeyOptions{File: writeKey(t, rsaKey.Public), Algorithm: "PS384"}, "PS384"},
		{"P-256", KeyOptions{File: writeKey(t, ecKey.Public)}, "ES256"},
		{"P-384", KeyOptions{File: writeKey(t, pemPublic(t, &p384.PublicKey))}, "ES384"},
		{"HMAC", KeyOptions{File: writeKey(t, "shared secret\n"), Algorithm: "HS256", KeyID: "prod", Scope: "write"}, "HS256"},
	}
	for _, c := range good {
		v, err := LoadKey(c.k)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		id := c.k.KeyID
		if id == "" {
			id = "default"
		}
		kc, err := v.GetPublicKey(id)
		if err != nil || kc.Algorithm != c.alg || v.KeyID != "" || v.Scope != c.k.Scope {
			t.Errorf("%s: %+v %+v %v", c.name, v, kc, err)
		}
	}
	bad := []struct {
		name string
		k    KeyOptions
		want string
	}{
		{"missing", KeyOptions{File: filepath.Join(t.TempDir(), "nope")}, "no such file"},
		{"private", KeyOptions{File: writeKey(t, rsaKey.Private)}, "give the node the public key only"},
		{"RSA for ES256", KeyOptions{File: writeKey(t, rsaKey.Public), Algorithm: "ES256"}, "an RSA key cannot verify ES256"},
		{"P-256 for ES384", KeyOptions{File: writeKey(t, ecKey.Public), Algorithm: "ES384"}, "verifies ES256 signatures, not ES384"},
		{"unknown algorithm", KeyOptions{File: writeKey(t, rsaKey.Public), Algorithm: "RS1"}, `algorithm "RS1" is not one of`},
		{"secret without algorithm", KeyOptions{File: writeKey(t, "shared secret")}, "name its algorithm (HS256"},
		{"empty secret", KeyOptions{File: writeKey(t, "\n"), Algorithm: "HS512"}, "the HMAC secret is empty"},
		{"ed25519", KeyOptions{File: writeKey(t, pemPublic(t, edPub))}, "bundle signatures use RSA, ECDSA or an HMAC secret"},
	}
	for _, c := range bad {
		_, err := LoadKey(c.k)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
