package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/keys"

	"github.com/gpu-arbiter/arbiter/internal/bundletest"
)

func verifyWith(k bundletest.Key, scope string) *BundleOptions {
	return &BundleOptions{Verification: bundle.NewVerificationConfig(
		map[string]*keys.Config{k.ID: {Key: k.Public, Algorithm: k.Alg}}, "", scope, nil)}
}

// codeOf is the code of err's first diagnostic, "" when it is no *Error.
func codeOf(err error) string {
	var pe *Error
	if !errors.As(err, &pe) || len(pe.Diagnostics) == 0 {
		return ""
	}
	return pe.Diagnostics[0].Code
}

// TestReadBundleSignatures: with a key, only a bundle signed by it with
// every file intact reads, and says it was verified; without one, a
// signed bundle reads and says its signature went unchecked.
func TestReadBundleSignatures(t *testing.T) {
	key, other := bundletest.RSAKey(t), bundletest.RSAKey(t)
	b := bundletest.Bundle{Revision: "v7", Modules: map[string]string{"arbiter/p.rego": goodPolicy, "arbiter/p_test.rego": goodTest}}
	signed := b.Signed(t, key, "")

	src, err := ReadBundle("srv/b.tar.gz", signed, verifyWith(key, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if src.Revision != "v7" || src.Signature != SignatureVerified || len(src.Files()) != 2 {
		t.Fatalf("revision %q signature %q files %v", src.Revision, src.Signature, src.Files())
	}
	if src, err = ReadBundle("srv/b.tar.gz", signed, nil, nil); err != nil || src.Signature != SignatureUnchecked {
		t.Fatalf("signed, no key: %v %+v", err, src)
	}
	if src, err = ReadBundle("srv/b.tar.gz", b.Build(t), nil, nil); err != nil || src.Signature != SignatureUnsigned {
		t.Fatalf("unsigned, no key: %v %+v", err, src)
	}
	hmac := bundletest.HMACKey("s3cret")
	if _, err := ReadBundle("b", b.Signed(t, hmac, ""), verifyWith(hmac, ""), nil); err != nil {
		t.Fatalf("HS256: %v", err)
	}
	ec := bundletest.ECKey(t)
	if _, err := ReadBundle("b", b.Signed(t, ec, ""), verifyWith(ec, ""), nil); err != nil {
		t.Fatalf("ES256: %v", err)
	}

	renamed := key
	renamed.ID = "staging"
	refused := []struct {
		name string
		data []byte
		opts *BundleOptions
		want string
	}{
		{"unsigned", b.Build(t), verifyWith(key, ""), "bundle missing .signatures.json file"},
		{"other key", b.Signed(t, other, ""), verifyWith(key, ""), "failed to verify JWT signature"},
		{"other key id", b.Signed(t, renamed, ""), verifyWith(key, ""), "verification key corresponding to ID staging not found"},
		{"scope", b.Signed(t, key, "write"), verifyWith(key, ""), "scope mismatch"},
		{"file changed", bundletest.Tamper(t, signed, "arbiter/p.rego", goodPolicy+"\n# changed\n"), verifyWith(key, ""), "arbiter/p.rego: digest mismatch"},
		{"manifest changed", bundletest.Tamper(t, signed, ".manifest", `{"revision": "v8"}`), verifyWith(key, ""), ".manifest: digest mismatch"},
		{"file added", bundletest.Tamper(t, signed, "arbiter/extra.rego", "package arbiter.extra\n"), verifyWith(key, ""), "file arbiter/extra.rego not included in bundle signature"},
		// A broken file that was not signed is refused for its signature,
		// not reported for its syntax.
		{"broken file changed", bundletest.Tamper(t, signed, "arbiter/p.rego", "package arbiter\nclassify := {\n"), verifyWith(key, ""), "digest mismatch"},
	}
	for _, c := range refused {
		_, err := ReadBundle("srv/b.tar.gz", c.data, c.opts, nil)
		if codeOf(err) != CodeSignature || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %s with %q", c.name, err, CodeSignature, c.want)
		}
	}
	if _, err := ReadBundle("b", b.Signed(t, key, "write"), verifyWith(key, "write"), nil); err != nil {
		t.Errorf("scope write: %v", err)
	}
}

// TestReadBundleRefusesBadArchives: garbage, a file or a whole bundle
// over the limits (data files and files the policy does not read count
// too), and a signed bundle whose policy does not parse, each with its
// code and where.
func TestReadBundleRefusesBadArchives(t *testing.T) {
	b := bundletest.Bundle{Modules: map[string]string{"p.rego": goodPolicy}}
	big := bundletest.Tamper(t, b.Build(t), "assets/blob.bin", strings.Repeat("x", 3000))
	cases := []struct {
		name string
		data []byte
		opts *Options
		code string
		want string
	}{
		{"garbage", []byte("<html>not found</html>"), nil, CodeBundle, "not a gzipped tar archive"},
		{"one file too big", b.Build(t), &Options{MaxFileBytes: 100}, CodeBundle, "p.rego: 1"},
		{"other files count", big, &Options{MaxTotalBytes: 2048}, CodeBundle, "bundle exceeds 2048 bytes in all"},
		{"bad manifest", bundletest.Tamper(t, b.Build(t), ".manifest", "{"), nil, CodeBundle, "manifest decode"},
		{"syntax", bundletest.Tamper(t, b.Build(t), "p.rego", "package arbiter\nclassify := {\n"), nil, "rego_parse_error", "b.tar.gz/p.rego:3"},
	}
	for _, c := range cases {
		_, err := ReadBundle("b.tar.gz", c.data, nil, c.opts)
		if codeOf(err) != c.code || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %s with %q", c.name, err, c.code, c.want)
		}
	}
}
