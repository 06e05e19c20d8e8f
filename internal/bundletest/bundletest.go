// Package bundletest builds OPA bundles for tests, signed or not, with
// OPA's own bundle writer and signer, and tampers with them afterwards.
// It is never used outside tests.
package bundletest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
)

// Bundle is a bundle's content.
type Bundle struct {
	// Modules are the Rego files by path inside the bundle
	// ("arbiter/policy.rego"), tests included.
	Modules map[string]string
	// Revision is the manifest's revision; empty: no manifest.
	Revision string
	// Data is the bundle's data.json; nil writes an empty object.
	Data map[string]any
}

// Key is a signing key and what verifies it.
type Key struct {
	// Alg is the JWT algorithm (RS256, ES256, HS256, ...).
	Alg string
	// ID is the key id the signature names (`opa build`'s default is
	// "default").
	ID string
	// Private signs: a PEM private key, or the HMAC secret.
	Private string
	// Public verifies: a PEM public key, or the HMAC secret.
	Public string
}

// RSAKey returns a new 2048-bit RSA key for RS256 with id "default".
func RSAKey(t testing.TB) Key {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return pemKey(t, "RS256", k, &k.PublicKey)
}

// ECKey returns a new P-256 key for ES256 with id "default".
func ECKey(t testing.TB) Key {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pemKey(t, "ES256", k, &k.PublicKey)
}

// HMACKey returns an HS256 key with id "default" for secret.
func HMACKey(secret string) Key {
	return Key{Alg: "HS256", ID: "default", Private: secret, Public: secret}
}

func pemKey(t testing.TB, alg string, priv, pub any) Key {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return Key{Alg: alg, ID: "default",
		Private: string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		Public:  string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))}
}

// Build writes b as a gzipped tar archive, unsigned.
func (b Bundle) Build(t testing.TB) []byte {
	t.Helper()
	ob := b.opa()
	return write(t, ob)
}

// Signed writes b signed with k, as `opa build --signing-key` does;
// scope, when set, is the signature's scope claim.
func (b Bundle) Signed(t testing.TB, k Key, scope string) []byte {
	t.Helper()
	ob := b.opa()
	sc := bundle.NewSigningConfig(k.Private, k.Alg, "")
	if scope != "" {
		claims := filepath.Join(t.TempDir(), "claims.json")
		j, _ := json.Marshal(map[string]any{"scope": scope})
		if err := os.WriteFile(claims, j, 0o600); err != nil {
			t.Fatal(err)
		}
		sc.ClaimsPath = claims
	}
	if err := ob.GenerateSignature(sc, k.ID, false); err != nil {
		t.Fatal(err)
	}
	return write(t, ob)
}

func (b Bundle) opa() *bundle.Bundle {
	ob := &bundle.Bundle{Data: b.Data, Manifest: bundle.Manifest{Revision: b.Revision}}
	if ob.Data == nil {
		ob.Data = map[string]any{}
	}
	names := make([]string, 0, len(b.Modules))
	for n := range b.Modules {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := "/" + strings.TrimPrefix(n, "/")
		ob.Modules = append(ob.Modules, bundle.ModuleFile{URL: p, Path: p, Raw: []byte(b.Modules[n])})
	}
	return ob
}

func write(t testing.TB, ob *bundle.Bundle) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).Write(*ob); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Tamper returns data with the file at name (a path inside the bundle,
// without the leading slash) given body: replaced where it exists, added
// where it does not. The signature, if any, is kept as it was.
func Tamper(t testing.TB, data []byte, name, body string) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	tw := tar.NewWriter(zw)
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimPrefix(h.Name, "/") == name {
			content, found = []byte(body), true
		}
		h.Size = int64(len(content))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(content); err != nil {
			t.Fatal(err)
		}
	}
	if !found {
		if err := tw.WriteHeader(&tar.Header{Name: "/" + name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
