package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
)

// Error codes of a bundle that could not be read.
const (
	// CodeBundle: not an OPA bundle (a gzipped tar archive with an optional
	// .manifest), or one over the size limits.
	CodeBundle = "arbiter_bundle_error"
	// CodeSignature: a bundle whose signature was required and did not
	// verify: none, another key, or a file changed, added or removed after
	// signing.
	CodeSignature = "arbiter_signature_error"
)

// Signature says what is known of the signature of the bundle a policy
// came from.
type Signature string

// The signature states of a bundle.
const (
	// SignatureUnsigned: the bundle has no .signatures.json.
	SignatureUnsigned Signature = "unsigned"
	// SignatureUnchecked: the bundle is signed, but was read without a
	// key, so its signature was not checked.
	SignatureUnchecked Signature = "unchecked"
	// SignatureVerified: the signature verified with the configured key
	// and covers every file of the bundle.
	SignatureVerified Signature = "verified"
)

// BundleOptions say how ReadBundle checks a bundle's signature; nil reads
// it without checking one.
type BundleOptions struct {
	// Verification, when set, requires a signature in OPA's bundle signing
	// format (.signatures.json, a JWT listing every file's digest) that
	// verifies with its keys: an unsigned bundle, one signed with another
	// key, scope or key id, and one with a file changed, added or removed
	// after signing are refused with CodeSignature.
	Verification *bundle.VerificationConfig
}

// maxBundleFiles bounds the files of a bundle, whatever their size.
const maxBundleFiles = 4096

// ReadBundle reads an OPA bundle (a gzipped tar archive) held in data;
// name is the bundle's name in file names and messages. It reads what a
// bundle file on disk gives Read, and checks the signature as bo says.
// Every file of the archive counts against the size limits of opts before
// anything is parsed.
func ReadBundle(name string, data []byte, bo *BundleOptions, opts *Options) (*Source, error) {
	var v *bundle.VerificationConfig
	if bo != nil {
		v = bo.Verification
	}
	return readBundleBytes(name, data, v, opts.withDefaults())
}

// readBundle reads a bundle file from disk, without a signature check.
func readBundle(p string, o Options) (*Source, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, o.MaxTotalBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read bundle %s: %w", p, err)
	}
	if int64(len(data)) > o.MaxTotalBytes {
		return nil, bundleError(p, CodeBundle, fmt.Errorf("the file is over %d bytes (Options.MaxTotalBytes)", o.MaxTotalBytes))
	}
	return readBundleBytes(p, data, nil, o)
}

// readBundleBytes reads a bundle in three passes over the same bytes: the
// archive with the size limits; OPA's reader for the layout and manifest,
// then, with a key, again for the signature (OPA checks every file's digest
// before it parses any); and last our parser, so that a bundle and its
// unpacked directory give the same errors at the same file names. A
// tampered bundle is therefore refused for its signature, never reported
// for what its altered files say.
func readBundleBytes(name string, data []byte, verify *bundle.VerificationConfig, o Options) (*Source, error) {
	files, signed, err := untar(bytes.NewReader(data), o)
	if err != nil {
		return nil, bundleError(name, CodeBundle, err)
	}
	reader := func() *bundle.Reader {
		return bundle.NewReader(bytes.NewReader(data)).WithSizeLimitBytes(o.MaxFileBytes + 1).WithRegoVersion(ast.RegoV1)
	}
	b, layoutErr := reader().WithSkipBundleVerification(true).Read()
	if layoutErr != nil && !isParseError(layoutErr) {
		return nil, bundleError(name, CodeBundle, layoutErr)
	}
	sig := SignatureUnsigned
	if signed {
		sig = SignatureUnchecked
	}
	if verify != nil {
		if _, err := reader().WithBundleVerificationConfig(verify).Read(); err != nil && !isParseError(err) {
			return nil, bundleError(name, CodeSignature, err)
		}
		sig = SignatureVerified
	}
	src, err := parseFiles(name, files, "", o)
	if err != nil {
		return nil, err
	}
	if layoutErr != nil {
		return nil, diagnose(name, layoutErr) // OPA's parser refused what ours took
	}
	src.Signature = sig
	if b.Manifest.Revision != "" {
		src.Revision = b.Manifest.Revision
	}
	return src, nil
}

func isParseError(err error) bool {
	var errs ast.Errors
	var one *ast.Error
	return errors.As(err, &errs) || errors.As(err, &one)
}

func bundleError(name, code string, err error) error {
	return &Error{Source: name, Diagnostics: []Diagnostic{{Code: code, File: name, Message: err.Error()}}}
}

// untar returns the policy files of a gzipped tar archive, and whether it
// holds a signatures file. Every regular file counts against the limits,
// policy file or not: OPA's reader holds them all in memory.
func untar(r io.Reader, o Options) (map[string][]byte, bool, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, false, fmt.Errorf("not a gzipped tar archive: %w", err)
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	var total int64
	var n int
	var signed bool
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, signed, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("not a readable tar archive: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if n++; n > maxBundleFiles {
			return nil, false, fmt.Errorf("more than %d files", maxBundleFiles)
		}
		if h.Size > o.MaxFileBytes {
			return nil, false, fmt.Errorf("%s: %d bytes, over the %d-byte limit for one policy file", name, h.Size, o.MaxFileBytes)
		}
		if total += h.Size; total > o.MaxTotalBytes {
			return nil, false, fmt.Errorf("bundle exceeds %d bytes in all", o.MaxTotalBytes)
		}
		if bundle.IsSignaturesFile(name) {
			signed = true
		}
		if !isPolicyFile(path.Base(name)) {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, o.MaxFileBytes+1))
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", name, err)
		}
		files[name] = b
	}
}
