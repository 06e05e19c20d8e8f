package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	want := Config{
		Listen:    "127.0.0.1:9400",
		Socket:    "/run/arbiter/arbiter.sock",
		StateDir:  "/var/lib/arbiter",
		BPFFS:     "/sys/fs/bpf/arbiter",
		LogFormat: "auto",
		LogLevel:  "info",

		BundleKeyID:    "default",
		BundlePoll:     time.Minute,
		BundleTimeout:  30 * time.Second,
		BundleMaxBytes: 16 << 20,
	}
	d := Default()
	if d != want {
		t.Fatalf("Default() = %+v\nwant        %+v", d, want)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("Default() does not validate: %v", err)
	}
}

func TestSettingsCoverEveryField(t *testing.T) {
	// Setting each key to a distinct valid value must change a distinct
	// field: a setting whose setter writes the wrong field, or a field
	// with no setting, shows up here.
	values := map[string]string{
		"policy": "/p", "listen": "10.0.0.1:1", "tls_cert": "/c.pem", "tls_key": "/k.key", "listen_plain": "true", "socket": "/s.sock", "state_dir": "/st",
		"bpffs": "/b", "allow_unverified_driver": "true", "log_format": "json", "log_level": "debug",
		"bundle_url": "https://bundles.example.com/a.tar.gz", "bundle_public_key": "/k.pem", "bundle_key_alg": "ES256",
		"bundle_key_id": "prod", "bundle_scope": "write", "bundle_token_file": "/t", "bundle_poll": "2m0s",
		"bundle_timeout": "5s", "bundle_max_bytes": "8MiB",
	}
	c := Default()
	for _, s := range Settings() {
		v, ok := values[s.Key]
		if !ok {
			t.Fatalf("setting %q has no test value", s.Key)
		}
		if err := c.SetFlag(s.Flag(), v); err != nil {
			t.Fatal(err)
		}
		if got := s.Get(&c); got != v {
			t.Errorf("%s: Get = %q after setting %q", s.Key, got, v)
		}
	}
	want := Config{Policy: "/p", Listen: "10.0.0.1:1", TLSCert: "/c.pem", TLSKey: "/k.key", ListenPlain: true, Socket: "/s.sock", StateDir: "/st", BPFFS: "/b",
		AllowUnverifiedDriver: true, LogFormat: "json", LogLevel: "debug",
		BundleURL: "https://bundles.example.com/a.tar.gz", BundlePublicKey: "/k.pem", BundleKeyAlg: "ES256", BundleKeyID: "prod",
		BundleScope: "write", BundleTokenFile: "/t", BundlePoll: 2 * time.Minute, BundleTimeout: 5 * time.Second, BundleMaxBytes: 8 << 20}
	if c != want {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
	if len(values) != len(Settings()) {
		t.Fatalf("%d test values for %d settings", len(values), len(Settings()))
	}
}

func TestParseFullFile(t *testing.T) {
	const file = `
policy: /etc/arbiter/policy.d
listen: "[::1]:9500"
socket: /run/arb/a.sock
state_dir: /srv/arbiter/state
bpffs: /sys/fs/bpf/arb
allow_unverified_driver: true
log_format: json
log_level: warn
`
	got, err := Parse("full.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Policy, want.Listen, want.Socket, want.StateDir, want.BPFFS = "/etc/arbiter/policy.d", "[::1]:9500", "/run/arb/a.sock", "/srv/arbiter/state", "/sys/fs/bpf/arb"
	want.AllowUnverifiedDriver, want.LogFormat, want.LogLevel = true, "json", "warn"
	if got != want {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestParsePartialFileKeepsDefaults(t *testing.T) {
	got, err := Parse("p.yaml", []byte("log_level: debug\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.LogLevel = "debug"
	if got != want {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	for _, empty := range []string{"", "# only a comment\n", "---\n"} {
		got, err := Parse("e.yaml", []byte(empty))
		if err != nil || got != Default() {
			t.Errorf("Parse(%q) = %+v, %v; want Default()", empty, got, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, file string
		want       []string // every one must appear in the error
	}{
		{"unknown key with line", "listen: 127.0.0.1:1\n\nlisten_addr: x\n",
			[]string{`c.yaml:3: unknown key "listen_addr"`, "known keys: policy, listen"}},
		{"typo suggests", "log_levl: info\n", []string{`c.yaml:1: unknown key "log_levl" (did you mean "log_level"?)`}},
		{"flag spelling is not a key", "state-dir: /x\n", []string{`unknown key "state-dir" (did you mean "state_dir"?)`}},
		{"duplicate", "log_level: info\nlog_level: debug\n", []string{`c.yaml:2: key "log_level" set twice (first on line 1)`}},
		{"bad address", "listen: localhost\n", []string{`c.yaml:1: listen: "localhost" is not HOST:PORT`}},
		{"port out of range", "listen: 127.0.0.1:70000\n", []string{`port "70000" is not a number from 1 to 65535`}},
		{"port zero", "listen: 127.0.0.1:0\n", []string{`port "0"`}},
		{"bad host", "listen: 'bad host:80'\n", []string{`host "bad host" is neither`}},
		{"number is not an address", "listen: 9400\n", []string{`listen: "9400" is not HOST:PORT`}},
		{"relative state dir", "state_dir: var/lib/arbiter\n", []string{`state_dir: "var/lib/arbiter" is a relative path; give an absolute path`}},
		{"relative policy", "policy: ./policy.d\n", []string{`policy: "./policy.d" is a relative path`}},
		{"empty bpffs", "bpffs: ''\n", []string{"bpffs: is empty; give an absolute path"}},
		{"socket too long", "socket: /" + strings.Repeat("s", 120) + "\n", []string{"a unix socket path holds at most 107"}},
		{"socket is a directory", "socket: /run/arbiter/\n", []string{"names a directory"}},
		{"bool as string", "allow_unverified_driver: 'yes'\n", []string{`allow_unverified_driver: "yes" is not true or false`}},
		{"bool as word", "allow_unverified_driver: yes\n", []string{`"yes" is not true or false`}},
		{"listen_plain as word", "listen_plain: on\n", []string{`listen_plain: "on" is not true or false`}},
		{"relative certificate", "tls_cert: tls.crt\n", []string{`tls_cert: "tls.crt" is a relative path`}},
		{"log format", "log_format: xml\n", []string{`log_format: "xml" is not one of auto, json, text`}},
		{"log level", "log_level: verbose\n", []string{`"verbose" is not one of trace, debug, info, warn, error`}},
		{"null value", "listen:\n", []string{`c.yaml:1: listen: no value; remove the line to keep the default ("127.0.0.1:9400")`}},
		{"list value", "listen:\n  - a\n", []string{"listen: want a single value, not a list"}},
		{"not a mapping", "- listen\n", []string{"c.yaml:1: the file must be a mapping of settings"}},
		{"two documents", "log_level: info\n---\nlog_level: debug\n", []string{"c.yaml:2: a second YAML document"}},
		{"bad yaml", "listen: [\n", []string{"c.yaml: not valid YAML"}},
		{"every error at once", "listn: a\nlog_level: loud\nsocket: rel\n",
			[]string{`c.yaml:1: unknown key "listn"`, `c.yaml:2: log_level: "loud"`, `c.yaml:3: socket: "rel" is a relative path`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("c.yaml", []byte(tc.file))
			if err == nil {
				t.Fatalf("no error for %q", tc.file)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	c := Default()
	c.Listen = "nope"
	c.LogLevel = "chatty"
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"config: the settings: 2 errors:\n", `  listen: "nope" is not HOST:PORT`, `  log_level: "chatty"`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

// TestTLSSettings: a certificate and its key together, and not with
// listen_plain, each error naming the keys and the fix.
func TestTLSSettings(t *testing.T) {
	good, err := Parse("t.yaml", []byte("listen: \":9443\"\ntls_cert: /etc/arbiter/tls/tls.crt\ntls_key: /etc/arbiter/tls/tls.key\n"))
	if err != nil {
		t.Fatal(err)
	}
	if good.TLSCert != "/etc/arbiter/tls/tls.crt" || good.TLSKey != "/etc/arbiter/tls/tls.key" || good.ListenPlain {
		t.Fatalf("%+v", good)
	}
	if err := good.Validate(); err != nil {
		t.Errorf("a certificate and its key: %v", err)
	}
	plain, err := Parse("p.yaml", []byte("listen: \":9400\"\nlisten_plain: true\n"))
	if err != nil || !plain.ListenPlain {
		t.Fatalf("listen_plain: %+v %v", plain, err)
	}
	if err := plain.Validate(); err != nil {
		t.Errorf("listen_plain alone: %v", err)
	}
	for _, c := range []struct{ file, want string }{
		{"tls_cert: /c.pem\n", "config: tls_cert (/c.pem) is set but tls_key is not: give the certificate's private key too"},
		{"tls_key: /k.pem\n", "config: tls_key (/k.pem) is set but tls_cert is not: give the certificate too"},
		{"tls_cert: /c.pem\ntls_key: /k.pem\nlisten_plain: true\n", "config: listen_plain and tls_cert/tls_key are both set"},
	} {
		cfg, err := Parse("t.yaml", []byte(c.file))
		if err != nil {
			t.Fatalf("%q: %v", c.file, err)
		}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v\nwant %q", c.file, err, c.want)
		}
	}
}

// TestFlagsOverrideFile follows the merge rule of the package comment: the
// file over the defaults, then only the flags given.
func TestFlagsOverrideFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("log_level: debug\nlisten: 127.0.0.1:9500\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, used, err := Resolve(path)
	if err != nil || used != path {
		t.Fatalf("Resolve = %v, %q", err, used)
	}
	if err := c.SetFlag("listen", "0.0.0.0:9600"); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "0.0.0.0:9600" || c.LogLevel != "debug" || c.StateDir != Default().StateDir {
		t.Fatalf("merged = %+v", c)
	}

	t.Chdir(dir)
	if err := c.SetFlag("state-dir", "state"); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "state"); c.StateDir != want {
		t.Errorf("relative --state-dir became %q, want %q", c.StateDir, want)
	}
	if err := c.SetFlag("policy", ""); err != nil || c.Policy != "" {
		t.Errorf("--policy '' = %q, %v; want the embedded default", c.Policy, err)
	}
	for _, bad := range []struct{ name, value, want string }{
		{"listen", "x", `config: --listen: "x" is not HOST:PORT`},
		{"log-format", "yaml", `config: --log-format: "yaml" is not one of`},
		{"allow-unverified-driver", "maybe", `--allow-unverified-driver: "maybe" is not true or false`},
		{"config", "/x", "config: no setting --config (settings: policy, listen, tls-cert, tls-key, listen-plain, socket, state-dir"},
	} {
		err := c.SetFlag(bad.name, bad.value)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("SetFlag(%q, %q) = %v, want %q", bad.name, bad.value, err, bad.want)
		}
	}
}

func TestResolveMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.yaml")
	_, _, err := Resolve(missing)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Resolve(missing --config) = %v, want a not-exist error naming the file", err)
	}
	if _, err := os.Stat(DefaultPath); errors.Is(err, fs.ErrNotExist) {
		c, used, err := Resolve("")
		if err != nil || used != "" || c != Default() {
			t.Fatalf("Resolve(\"\") without %s = %+v, %q, %v; want Default()", DefaultPath, c, used, err)
		}
	}
}

// shipped is the path of the configuration file the packages install.
const shipped = "../deploy/config.yaml"

// TestShippedFile loads the shipped file: it must equal Default() except
// for the policy directory it says it changes.
func TestShippedFile(t *testing.T) {
	got, err := Load(shipped)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Policy = "/etc/arbiter/policy.d"
	if got != want {
		t.Fatalf("%s = %+v\nwant %+v", shipped, got, want)
	}
}

// TestShippedFileDocumentsEveryKey checks that every setting appears in the
// shipped file with a comment above it, and that each commented-out line
// shows the true default: uncommenting them all must load to the same
// configuration.
func TestShippedFileDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile(shipped)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	commented := regexp.MustCompile(`^# ([a-z_]+): (.*)$`)
	active := regexp.MustCompile(`^([a-z_]+): `)
	found := map[string]bool{}
	var uncommented []string
	for i, l := range lines {
		key := ""
		if m := commented.FindStringSubmatch(l); m != nil {
			if _, ok := lookup(m[1]); ok {
				key = m[1]
				l = m[1] + ": " + m[2]
			}
		} else if m := active.FindStringSubmatch(l); m != nil {
			key = m[1]
		}
		if key != "" {
			if found[key] {
				t.Errorf("%s:%d: %s appears twice", shipped, i+1, key)
			}
			found[key] = true
			if i == 0 || !strings.HasPrefix(lines[i-1], "#") || commented.MatchString(lines[i-1]) {
				t.Errorf("%s:%d: %s has no comment above it", shipped, i+1, key)
			}
		}
		uncommented = append(uncommented, l)
	}
	for _, s := range Settings() {
		if !found[s.Key] {
			t.Errorf("%s does not document %s", shipped, s.Key)
		}
	}
	got, err := Parse("uncommented", []byte(strings.Join(uncommented, "\n")))
	if err != nil {
		t.Fatalf("the shipped file with every key uncommented: %v", err)
	}
	want := Default()
	want.Policy = "/etc/arbiter/policy.d"
	if got != want {
		t.Fatalf("uncommented shipped file = %+v\nwant %+v (a commented default is wrong)", got, want)
	}
}

// TestBundleSettings: sizes and durations in their forms, and the bundle
// settings that only make sense together, each error naming the keys and
// the fix.
func TestBundleSettings(t *testing.T) {
	got, err := Parse("b.yaml", []byte("bundle_url: https://bundles.example.com/arbiter/prod.tar.gz\nbundle_public_key: /etc/arbiter/bundle.pem\n"+
		"bundle_poll: 90s\nbundle_timeout: 10s\nbundle_max_bytes: 512KiB\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got.BundlePoll != 90*time.Second || got.BundleTimeout != 10*time.Second || got.BundleMaxBytes != 512<<10 || got.BundleKeyID != "default" {
		t.Fatalf("%+v", got)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("valid bundle settings: %v", err)
	}
	for _, c := range []struct{ v string }{{"1048576"}, {"1MiB"}, {"2GiB"}, {"3 KiB"}} {
		if _, err := parseBytes(c.v); err != nil {
			t.Errorf("%q: %v", c.v, err)
		}
	}
	if formatBytes(1<<20) != "1MiB" || formatBytes(1000) != "1000" {
		t.Errorf("formatBytes: %s %s", formatBytes(1<<20), formatBytes(1000))
	}
	for _, c := range []struct{ file, want string }{
		{"bundle_url: ftp://x/b.tar.gz\n", "bundle_url: \"ftp://x/b.tar.gz\": want an http:// or https:// URL"},
		{"bundle_url: https://user:pw@/b\n", "no host"},
		{"bundle_poll: 10ms\n", `bundle_poll: "10ms" is less than 1s`},
		{"bundle_poll: often\n", `"often" is not a duration`},
		{"bundle_max_bytes: 16MB\n", `bundle_max_bytes: "16MB" is not a size`},
		{"bundle_max_bytes: 0\n", `"0" is not a size`},
		{"bundle_key_alg: RS1\n", `bundle_key_alg: "RS1" is not one of RS256`},
		{"bundle_key_id: ''\n", "bundle_key_id: is empty"},
		{"bundle_public_key: bundle.pem\n", "is a relative path"},
	} {
		_, err := Parse("b.yaml", []byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.file, err, c.want)
		}
	}
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Policy, c.BundleURL = "/etc/arbiter/policy.d", "https://b/x.tar.gz" },
			`policy (/etc/arbiter/policy.d) and bundle_url (https://b/x.tar.gz) are both set: the daemon takes its policy from one place; set policy to ""`},
		{func(c *Config) { c.BundlePublicKey = "/k.pem" }, "bundle_public_key is set but bundle_url is not"},
		{func(c *Config) { c.BundleTokenFile = "/t" }, "bundle_token_file is set but bundle_url is not"},
		{func(c *Config) { c.BundleURL, c.BundleKeyAlg = "https://b/x.tar.gz", "HS256" }, "bundle_key_alg and bundle_scope describe the key of bundle_public_key, which is not set"},
	} {
		cfg := Default()
		c.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", cfg, err, c.want)
		}
	}
}

// TestParseSeveralErrors: every wrong line of a file is reported, under
// one line that counts them, each naming its line.
func TestParseSeveralErrors(t *testing.T) {
	_, err := Parse("x.yaml", []byte("listen: nope\nlog_level: chatty\n"))
	want := "config: x.yaml: 2 errors:\n  x.yaml:1: listen: \"nope\" is not HOST:PORT"
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "\n  x.yaml:2: log_level: \"chatty\"") {
		t.Errorf("error %q\nwant it to start %q and name line 2", err, want)
	}
}
