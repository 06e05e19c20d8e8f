// Package config is the daemon's configuration: every setting of
// `arbiter run`, its default, how it is read from a YAML file, and how
// flags given on the command line override the file.
//
// Each setting has one name: the flag is --NAME with dashes, the YAML key
// is the same name with underscores (--state-dir, state_dir). The daemon
// builds its configuration in three steps, and only this order:
//
//  1. Default(): every setting at its default;
//  2. the file (Resolve or Load): a key present in the file replaces the
//     default, a key left out keeps it;
//  3. the flags given on the command line (Config.SetFlag for each flag the
//     user typed, e.g. from pflag's FlagSet.Visit, which visits only
//     those): a flag given replaces the file's value; a flag not given
//     never does, so its default cannot mask the file.
//
// The file is decoded strictly: an unknown key, a duplicate key, a value of
// the wrong kind or a bad value is an error that names the file, the line
// and the key. Paths in the file must be absolute (the daemon's working
// directory under systemd is /, which is rarely what a relative path
// meant); a relative path given as a flag is taken relative to the working
// directory of the command, as a shell user expects.
package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultPath is the configuration file the daemon reads when --config is
// not given, if it exists. The packages install one there.
const DefaultPath = "/etc/arbiter/config.yaml"

// Log formats and levels a configuration may name.
var (
	logFormats = []string{"auto", "json", "text"}
	logLevels  = []string{"trace", "debug", "info", "warn", "error"}
)

// Config is every setting of `arbiter run` except --config itself.
type Config struct {
	// Policy is the directory (or bundle) of Rego policy files; empty means
	// the default policy embedded in the binary. The packages ship one in
	// /etc/arbiter/policy.d.
	Policy string
	// Listen is the TCP address (HOST:PORT) of the HTTP API, console and
	// Prometheus /metrics.
	Listen string
	// TLSCert and TLSKey are the PEM files of the certificate and private
	// key Listen is served over HTTPS with; both or neither. Without them
	// Listen serves plain HTTP, on a loopback address only unless
	// ListenPlain.
	TLSCert, TLSKey string
	// ListenPlain serves Listen over plain HTTP even off loopback (a pod
	// network that only Prometheus and the kubelet reach): reads are open
	// there and the token of policy changes crosses the network in clear.
	ListenPlain bool
	// Socket is the path of the root-only unix socket the local commands
	// (arbiter ps, status) talk to.
	Socket string
	// StateDir holds what must outlive the daemon: the record of every
	// process it suspended or gated, so a later start or `arbiter recover`
	// can undo it.
	StateDir string
	// BPFFS is the directory on a BPF filesystem where the daemon pins its
	// maps and links.
	BPFFS string
	// AllowUnverifiedDriver lets the daemon control the channels of a
	// driver version whose control interface it has not been validated
	// against. Off by default: such a driver is only observed.
	AllowUnverifiedDriver bool
	// LogFormat is auto (text on a terminal, JSON otherwise), json or text.
	LogFormat string
	// LogLevel is trace, debug, info, warn or error.
	LogLevel string

	// BundleURL, when set, is the http(s) URL of a policy bundle on an
	// OPA-compatible bundle server: the daemon polls it instead of reading
	// Policy, which must then be empty.
	BundleURL string
	// BundlePublicKey is the file of the key every bundle must be signed
	// with (a PEM public key, or an HMAC secret with an HS* BundleKeyAlg);
	// empty: signatures are not checked.
	BundlePublicKey string
	// BundleKeyAlg is the signature algorithm (RS256, ES256, HS256, ...);
	// empty: the one the public key implies.
	BundleKeyAlg string
	// BundleKeyID is the key id a bundle's signature must name.
	BundleKeyID string
	// BundleScope, when set, is the scope a bundle's signature must carry.
	BundleScope string
	// BundleTokenFile holds a bearer token for the bundle server, read at
	// every request.
	BundleTokenFile string
	// BundlePoll is the least wait between two polls (up to half again is
	// added at random).
	BundlePoll time.Duration
	// BundleTimeout bounds one request to the bundle server.
	BundleTimeout time.Duration
	// BundleMaxBytes bounds a bundle's download.
	BundleMaxBytes int64
}

// Defaults of the bundle settings.
const (
	DefaultBundleKeyID    = "default"
	DefaultBundlePoll     = time.Minute
	DefaultBundleTimeout  = 30 * time.Second
	DefaultBundleMaxBytes = 16 << 20
	// MinBundlePoll keeps a fleet from polling its bundle server hard.
	MinBundlePoll = time.Second
)

// Default returns the configuration used where neither a file nor a flag
// says otherwise.
func Default() Config {
	return Config{
		Policy:    "",
		Listen:    "127.0.0.1:9400",
		Socket:    "/run/arbiter/arbiter.sock",
		StateDir:  "/var/lib/arbiter",
		BPFFS:     "/sys/fs/bpf/arbiter",
		LogFormat: "auto",
		LogLevel:  "info",

		BundleKeyID:    DefaultBundleKeyID,
		BundlePoll:     DefaultBundlePoll,
		BundleTimeout:  DefaultBundleTimeout,
		BundleMaxBytes: DefaultBundleMaxBytes,
	}
}

// Setting describes one setting, so that the command registers its flags
// and their help from the same table the file is decoded with.
type Setting struct {
	// Key is the YAML key, e.g. "state_dir".
	Key string
	// Usage is the one-line help of the flag; a word in back quotes
	// names the kind of value in the flag's help ("a `duration`").
	Usage string
	// Bool is true for a setting that takes true or false.
	Bool bool

	get func(*Config) string
	set func(*Config, string) error
	// path marks a setting that is a path: absolute in the file, made
	// absolute against the working directory when given as a flag.
	path bool
}

// Flag is the command-line flag name of the setting, e.g. "state-dir".
func (s Setting) Flag() string { return strings.ReplaceAll(s.Key, "_", "-") }

// Get returns the setting's value in c, as a flag would spell it.
func (s Setting) Get(c *Config) string { return s.get(c) }

// Settings returns every setting, in the order of the shipped file.
func Settings() []Setting {
	return append([]Setting{
		{Key: "policy", path: true,
			Usage: "directory or bundle of Rego policy files (empty: the embedded default policy, or the bundle server of --bundle-url)",
			get:   func(c *Config) string { return c.Policy },
			set:   func(c *Config, v string) error { c.Policy = v; return checkOptionalPath(v) }},
		{Key: "listen",
			Usage: "HOST:PORT of the HTTP API, console and /metrics",
			get:   func(c *Config) string { return c.Listen },
			set:   func(c *Config, v string) error { c.Listen = v; return checkListen(v) }},
		{Key: "tls_cert", path: true,
			Usage: "PEM certificate (chain) to serve --listen over HTTPS with, read again when it changes; needs --tls-key",
			get:   func(c *Config) string { return c.TLSCert },
			set:   func(c *Config, v string) error { c.TLSCert = v; return checkOptionalPath(v) }},
		{Key: "tls_key", path: true,
			Usage: "PEM private key of --tls-cert",
			get:   func(c *Config) string { return c.TLSKey },
			set:   func(c *Config, v string) error { c.TLSKey = v; return checkOptionalPath(v) }},
		{Key: "listen_plain", Bool: true,
			Usage: "serve --listen over plain HTTP even off loopback (a pod network only Prometheus and the kubelet reach): reads are open there and the token of policy changes crosses the network in clear",
			get:   func(c *Config) string { return strconv.FormatBool(c.ListenPlain) },
			set:   func(c *Config, v string) (err error) { c.ListenPlain, err = parseBool(v); return err }},
		{Key: "socket", path: true,
			Usage: "path of the root-only unix socket of the local commands",
			get:   func(c *Config) string { return c.Socket },
			set:   func(c *Config, v string) error { c.Socket = v; return checkSocket(v) }},
		{Key: "state_dir", path: true,
			Usage: "directory of the state that outlives the daemon (what it suspended, to undo)",
			get:   func(c *Config) string { return c.StateDir },
			set:   func(c *Config, v string) error { c.StateDir = v; return checkPath(v) }},
		{Key: "bpffs", path: true,
			Usage: "directory on a BPF filesystem to pin maps and links in",
			get:   func(c *Config) string { return c.BPFFS },
			set:   func(c *Config, v string) error { c.BPFFS = v; return checkPath(v) }},
		{Key: "allow_unverified_driver", Bool: true,
			Usage: "control channels on a driver version not validated with Arbiter (otherwise only observe them)",
			get:   func(c *Config) string { return strconv.FormatBool(c.AllowUnverifiedDriver) },
			set:   func(c *Config, v string) (err error) { c.AllowUnverifiedDriver, err = parseBool(v); return err }},
		{Key: "log_format",
			Usage: "log format: " + strings.Join(logFormats, ", ") + " (auto: text on a terminal, JSON otherwise)",
			get:   func(c *Config) string { return c.LogFormat },
			set:   func(c *Config, v string) error { c.LogFormat = v; return checkOneOf(v, logFormats) }},
		{Key: "log_level",
			Usage: "least severe level logged: " + strings.Join(logLevels, ", "),
			get:   func(c *Config) string { return c.LogLevel },
			set:   func(c *Config, v string) error { c.LogLevel = v; return checkOneOf(v, logLevels) }},
	}, bundleSettings()...)
}

// SetFlag applies a flag given on the command line: name is the flag name
// (state-dir) or the YAML key (state_dir). A relative path is made absolute
// against the working directory. Call it only for the flags the user gave,
// after the file was loaded; see the package comment.
func (c *Config) SetFlag(name, value string) error {
	s, ok := lookup(strings.ReplaceAll(name, "-", "_"))
	if !ok {
		return fmt.Errorf("config: no setting --%s (settings: %s)", name, strings.Join(flagNames(), ", "))
	}
	if s.path && value != "" && !filepath.IsAbs(value) {
		abs, err := filepath.Abs(value)
		if err != nil {
			return fmt.Errorf("config: --%s %s: make the path absolute: %w", s.Flag(), value, err)
		}
		value = abs
	}
	if err := s.set(c, value); err != nil {
		return fmt.Errorf("config: --%s: %w", s.Flag(), err)
	}
	return nil
}

// Validate checks every setting of c, and the settings that only make
// sense together, and returns all that are wrong, each naming its key, or
// nil.
func (c *Config) Validate() error {
	var errs []error
	for _, s := range Settings() {
		probe := *c
		if err := s.set(&probe, s.get(c)); err != nil {
			errs = append(errs, fmt.Errorf("config: %s: %w", s.Key, err))
		}
	}
	errs = append(errs, c.checkTLS()...)
	errs = append(errs, c.checkBundle()...)
	if len(errs) == 0 {
		return nil
	}
	return several("the settings", errs)
}

// checkTLS checks the settings of how listen is served, together.
func (c *Config) checkTLS() []error {
	var errs []error
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		errs = append(errs, fmt.Errorf("config: tls_cert (%s) is set but tls_key is not: give the certificate's private key too", c.TLSCert))
	case c.TLSKey != "" && c.TLSCert == "":
		errs = append(errs, fmt.Errorf("config: tls_key (%s) is set but tls_cert is not: give the certificate too", c.TLSKey))
	}
	if c.ListenPlain && (c.TLSCert != "" || c.TLSKey != "") {
		errs = append(errs, errors.New("config: listen_plain and tls_cert/tls_key are both set: listen is served over HTTPS or plain HTTP, not both; remove one"))
	}
	return errs
}

func lookup(key string) (Setting, bool) {
	for _, s := range Settings() {
		if s.Key == key {
			return s, true
		}
	}
	return Setting{}, false
}

func keys() []string {
	var out []string
	for _, s := range Settings() {
		out = append(out, s.Key)
	}
	return out
}

func flagNames() []string {
	var out []string
	for _, s := range Settings() {
		out = append(out, s.Flag())
	}
	return out
}

// checkListen accepts HOST:PORT with a numeric port from 1 to 65535; an
// empty host means every interface.
func checkListen(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("%q is not HOST:PORT (for example 127.0.0.1:9400, or :9400 for every interface): %w", v, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("%q: port %q is not a number from 1 to 65535", v, port)
	}
	if host != "" && net.ParseIP(host) == nil && !isHostname(host) {
		return fmt.Errorf("%q: host %q is neither an IP address nor a host name", v, host)
	}
	return nil
}

// isHostname reports whether h is a syntactically valid DNS name.
func isHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// maxSocketPath is the longest path a unix socket address holds
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

func checkSocket(v string) error {
	if err := checkPath(v); err != nil {
		return err
	}
	if len(v) > maxSocketPath {
		return fmt.Errorf("%q is %d bytes long; a unix socket path holds at most %d", v, len(v), maxSocketPath)
	}
	if strings.HasSuffix(v, "/") {
		return fmt.Errorf("%q names a directory; name the socket file in it, e.g. %s", v, filepath.Join(v, "arbiter.sock"))
	}
	return nil
}

func checkOptionalPath(v string) error {
	if v == "" {
		return nil
	}
	return checkPath(v)
}

func checkPath(v string) error {
	switch {
	case v == "":
		return errors.New("is empty; give an absolute path")
	case !filepath.IsAbs(v):
		return fmt.Errorf("%q is a relative path; give an absolute path (the daemon's working directory is /)", v)
	case strings.ContainsRune(v, 0):
		return fmt.Errorf("%q contains a NUL byte", v)
	}
	return nil
}

func parseBool(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%q is not true or false", v)
	}
	return b, nil
}

func checkOneOf(v string, allowed []string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %s", v, strings.Join(allowed, ", "))
}
