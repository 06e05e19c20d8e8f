package config

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// bundleSettings are the settings of a policy bundle server
// (--bundle-url), in the order of the shipped file.
func bundleSettings() []Setting {
	return []Setting{
		{Key: "bundle_url",
			Usage: "http(s) URL of a policy bundle on an OPA-compatible bundle server, polled instead of --policy (which must be empty)",
			get:   func(c *Config) string { return c.BundleURL },
			set:   func(c *Config, v string) error { c.BundleURL = v; return checkBundleURL(v) }},
		{Key: "bundle_public_key", path: true,
			Usage: "file of the key bundles must be signed with: a PEM public key, or an HMAC secret with --bundle-key-alg HS256 (empty: signatures are not checked)",
			get:   func(c *Config) string { return c.BundlePublicKey },
			set:   func(c *Config, v string) error { c.BundlePublicKey = v; return checkOptionalPath(v) }},
		{Key: "bundle_key_alg",
			Usage: "signature algorithm of --bundle-public-key: " + strings.Join(bundleAlgs, ", ") + " (empty: the one the key implies)",
			get:   func(c *Config) string { return c.BundleKeyAlg },
			set: func(c *Config, v string) error {
				c.BundleKeyAlg = v
				if v == "" {
					return nil
				}
				return checkOneOf(v, bundleAlgs)
			}},
		{Key: "bundle_key_id",
			Usage: "key id a bundle's signature must name (opa build signs with \"default\" unless --verification-key-id says otherwise)",
			get:   func(c *Config) string { return c.BundleKeyID },
			set: func(c *Config, v string) error {
				c.BundleKeyID = v
				if v == "" {
					return errors.New("is empty; opa build's key id is \"default\"")
				}
				return nil
			}},
		{Key: "bundle_scope",
			Usage: "scope a bundle's signature must carry (empty: none)",
			get:   func(c *Config) string { return c.BundleScope },
			set:   func(c *Config, v string) error { c.BundleScope = v; return nil }},
		{Key: "bundle_token_file", path: true,
			Usage: "file holding a bearer token for the bundle server, read at every request",
			get:   func(c *Config) string { return c.BundleTokenFile },
			set:   func(c *Config, v string) error { c.BundleTokenFile = v; return checkOptionalPath(v) }},
		{Key: "bundle_poll",
			Usage: "least wait (a `duration`) between two polls of the bundle server; up to half again is added at random",
			get:   func(c *Config) string { return c.BundlePoll.String() },
			set: func(c *Config, v string) (err error) {
				c.BundlePoll, err = parseDuration(v, MinBundlePoll)
				return err
			}},
		{Key: "bundle_timeout",
			Usage: "time limit (a `duration`) of one request to the bundle server, the download included",
			get:   func(c *Config) string { return c.BundleTimeout.String() },
			set: func(c *Config, v string) (err error) {
				c.BundleTimeout, err = parseDuration(v, time.Millisecond)
				return err
			}},
		{Key: "bundle_max_bytes",
			Usage: "largest bundle downloaded, a `size` in bytes or with a KiB, MiB or GiB suffix",
			get:   func(c *Config) string { return formatBytes(c.BundleMaxBytes) },
			set: func(c *Config, v string) (err error) {
				c.BundleMaxBytes, err = parseBytes(v)
				return err
			}},
	}
}

// bundleAlgs are the signature algorithms of OPA's bundle signing.
var bundleAlgs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "HS256", "HS384", "HS512"}

// checkBundle checks the bundle settings that only make sense together.
func (c *Config) checkBundle() []error {
	var errs []error
	if c.BundleURL != "" && c.Policy != "" {
		errs = append(errs, fmt.Errorf("config: policy (%s) and bundle_url (%s) are both set: the daemon takes its policy from one place; "+
			"set policy to \"\" (policy: \"\" in the config file, or --policy=\"\") to poll the bundle server, or remove bundle_url", c.Policy, c.BundleURL))
	}
	if c.BundleURL == "" {
		for _, s := range []struct{ key, v string }{{"bundle_public_key", c.BundlePublicKey}, {"bundle_key_alg", c.BundleKeyAlg},
			{"bundle_scope", c.BundleScope}, {"bundle_token_file", c.BundleTokenFile}} {
			if s.v != "" {
				errs = append(errs, fmt.Errorf("config: %s is set but bundle_url is not: set bundle_url too, or remove %s", s.key, s.key))
			}
		}
	}
	if c.BundlePublicKey == "" && (c.BundleKeyAlg != "" || c.BundleScope != "") {
		errs = append(errs, errors.New("config: bundle_key_alg and bundle_scope describe the key of bundle_public_key, which is not set"))
	}
	return errs
}

func checkBundleURL(v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL: %w", v, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want an http:// or https:// URL of a bundle, e.g. https://bundles.example.com/arbiter/bundle.tar.gz", u.Redacted())
	case u.Host == "":
		return fmt.Errorf("%q: no host", u.Redacted())
	}
	return nil
}

func parseDuration(v string, least time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (for example 60s, 2m, 1m30s)", v)
	}
	if d < least {
		return 0, fmt.Errorf("%q is less than %v", v, least)
	}
	return d, nil
}

// byteUnits are the suffixes parseBytes takes, largest first.
var byteUnits = []struct {
	suffix string
	n      int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// parseBytes reads a positive size in bytes, with an optional KiB, MiB or
// GiB suffix.
func parseBytes(v string) (int64, error) {
	num, unit := v, int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			num, unit = strings.TrimSpace(n), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/unit {
		return 0, fmt.Errorf("%q is not a size: give a positive number of bytes, or of KiB, MiB or GiB (for example 16MiB)", v)
	}
	return n * unit, nil
}

func formatBytes(n int64) string {
	for _, u := range byteUnits {
		if n >= u.n && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
