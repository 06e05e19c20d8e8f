package fetch

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/keys"
)

// DefaultKeyID is the key id `opa build --signing-key` signs with unless
// told otherwise (its --verification-key-id).
const DefaultKeyID = "default"

// KeyOptions name the key that bundles must be signed with.
type KeyOptions struct {
	// File holds the PEM public key (RSA or ECDSA, "PUBLIC KEY", "RSA
	// PUBLIC KEY" or a "CERTIFICATE") or, with an HMAC algorithm, the
	// shared secret: the file's bytes exactly, as `opa build` reads its
	// --signing-key file.
	File string
	// Algorithm is the JWT algorithm: RS256, RS384, RS512, PS256, PS384,
	// PS512, ES256, ES384, ES512, HS256, HS384 or HS512. Empty: RS256 for
	// an RSA key, ES256/ES384/ES512 for an ECDSA key by its curve; an HMAC
	// secret must name its algorithm.
	Algorithm string
	// KeyID is the key's id: a bundle's signature must name it (its JWT
	// "kid", or the "keyid" claim). Default DefaultKeyID.
	KeyID string
	// Scope, when set, must be the signature's scope claim; when empty, the
	// signature must carry no scope.
	Scope string
}

// LoadKey reads the key and returns the verification config of OPA's
// bundle reader for it. Every problem with the key is found here, at
// start, rather than as a refused bundle later.
func LoadKey(k KeyOptions) (*bundle.VerificationConfig, error) {
	raw, err := os.ReadFile(k.File)
	if err != nil {
		return nil, fmt.Errorf("bundle verification key: %w", err)
	}
	alg, err := keyAlgorithm(raw, k.Algorithm)
	if err != nil {
		return nil, fmt.Errorf("bundle verification key %s: %w", k.File, err)
	}
	id := k.KeyID
	if id == "" {
		id = DefaultKeyID
	}
	// No key id in the config itself: OPA then takes the signature's own
	// key id, which must be this one.
	return bundle.NewVerificationConfig(map[string]*keys.Config{id: {Key: string(raw), Algorithm: alg, Scope: k.Scope}}, "", k.Scope, nil), nil
}

// keyAlgorithm checks that raw is a key alg can verify with and returns
// alg, or the algorithm the key implies when alg is empty.
func keyAlgorithm(raw []byte, alg string) (string, error) {
	if alg != "" && !keys.IsSupportedAlgorithm(alg) {
		return "", fmt.Errorf("algorithm %q is not one of RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, HS256, HS384, HS512", alg)
	}
	if strings.HasPrefix(alg, "HS") {
		if len(strings.TrimSpace(string(raw))) == 0 {
			return "", errors.New("the HMAC secret is empty")
		}
		return alg, nil
	}
	pub, err := publicKey(raw)
	if err != nil {
		return "", err
	}
	switch key := pub.(type) {
	case *rsa.PublicKey:
		if alg == "" {
			return "RS256", nil
		}
		if !strings.HasPrefix(alg, "RS") && !strings.HasPrefix(alg, "PS") {
			return "", fmt.Errorf("an RSA key cannot verify %s signatures: use RS256 (the default of opa build), RS384, RS512, PS256, PS384 or PS512", alg)
		}
		return alg, nil
	case *ecdsa.PublicKey:
		want := map[string]string{"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}[key.Curve.Params().Name]
		if want == "" {
			return "", fmt.Errorf("ECDSA curve %s: bundle signatures use P-256, P-384 or P-521", key.Curve.Params().Name)
		}
		if alg != "" && alg != want {
			return "", fmt.Errorf("an ECDSA %s key verifies %s signatures, not %s", key.Curve.Params().Name, want, alg)
		}
		return want, nil
	default:
		return "", fmt.Errorf("a %T key: bundle signatures use RSA, ECDSA or an HMAC secret", pub)
	}
}

// publicKey parses the first PEM block of raw as a public key.
func publicKey(raw []byte) (any, error) {
	block, _ := pem.Decode(raw)
	if block == nil {
		return nil, errors.New("not a PEM public key (-----BEGIN PUBLIC KEY-----); for an HMAC secret, name its algorithm (HS256, HS384 or HS512)")
	}
	switch block.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		return c.PublicKey, nil
	case "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY":
		return nil, fmt.Errorf("a %s: give the node the public key only (openssl pkey -in KEY -pubout)", strings.ToLower(block.Type))
	}
	return nil, fmt.Errorf("a PEM %q block: want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", block.Type)
}
