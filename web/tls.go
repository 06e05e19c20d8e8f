package web

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// KeyPair is the TLS certificate and private key the TCP listener serves
// HTTPS with, read from PEM files. Both files are looked at again at each
// TLS handshake and read again when either changed, so that a renewed
// certificate (cert-manager's Secret volume, certbot) is served without a
// restart. A renewal that does not load (a key that does not match, a
// file half-written) leaves the pair in use serving, and is logged once.
type KeyPair struct {
	certFile, keyFile string
	log               zerolog.Logger

	mu     sync.Mutex
	cert   *tls.Certificate
	stamp  [2]fileStamp // of the files cert was read from
	failed [2]fileStamp // of the files whose reload failed last
}

// fileStamp tells a changed file from an unchanged one.
type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

// LoadKeyPair reads the certificate (chain) and the private key from
// their PEM files. Every error names the file at fault and what it
// should hold.
func LoadKeyPair(certFile, keyFile string, log zerolog.Logger) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile, log: log}
	cert, stamp, err := k.read()
	if err != nil {
		return nil, err
	}
	k.cert, k.stamp = cert, stamp
	if leaf := cert.Leaf; leaf != nil && time.Now().After(leaf.NotAfter) {
		log.Warn().Str("tls_cert", certFile).Time("not_after", leaf.NotAfter).Msg("the TLS certificate has expired: clients will refuse it until it is renewed")
	}
	return k, nil
}

// read reads and parses both files.
func (k *KeyPair) read() (*tls.Certificate, [2]fileStamp, error) {
	var stamp [2]fileStamp
	certPEM, err := readStamped(k.certFile, &stamp[0])
	if err != nil {
		return nil, stamp, fmt.Errorf("web: TLS certificate %s: %w", k.certFile, err)
	}
	keyPEM, err := readStamped(k.keyFile, &stamp[1])
	if err != nil {
		return nil, stamp, fmt.Errorf("web: TLS key %s: %w", k.keyFile, err)
	}
	if !hasPEM(certPEM, func(t string) bool { return t == "CERTIFICATE" }) {
		return nil, stamp, fmt.Errorf("web: TLS certificate %s holds no PEM certificate (a \"BEGIN CERTIFICATE\" block): give the certificate, in PEM, here and its key in the key file", k.certFile)
	}
	if !hasPEM(keyPEM, func(t string) bool { return strings.HasSuffix(t, "PRIVATE KEY") }) {
		return nil, stamp, fmt.Errorf("web: TLS key %s holds no PEM private key (a \"BEGIN ... PRIVATE KEY\" block): give the certificate's private key, in PEM, unencrypted", k.keyFile)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, stamp, fmt.Errorf("web: TLS certificate %s and key %s: %w", k.certFile, k.keyFile, err)
	}
	return &cert, stamp, nil
}

// GetCertificate is the tls.Config callback: the pair, read again first
// if either file changed.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var now [2]fileStamp
	for i, f := range []string{k.certFile, k.keyFile} {
		if fi, err := os.Stat(f); err == nil {
			now[i] = stampOf(fi)
		}
	}
	if now == k.stamp || now == k.failed {
		return k.cert, nil
	}
	cert, stamp, err := k.read()
	if err != nil {
		k.failed = now
		k.log.Error().Err(err).Msg("TLS certificate changed but does not load: still serving the one read before")
		return k.cert, nil
	}
	k.cert, k.stamp, k.failed = cert, stamp, [2]fileStamp{}
	ev := k.log.Info().Str("tls_cert", k.certFile)
	if cert.Leaf != nil {
		ev = ev.Time("not_after", cert.Leaf.NotAfter)
	}
	ev.Msg("TLS certificate read again after a change")
	return k.cert, nil
}

// config is the TLS configuration of the listener.
func (k *KeyPair) config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: k.GetCertificate}
}

// readStamped reads the file at path and records its stamp, taken before
// the read so that a change during it is seen at the next handshake.
func readStamped(path string, stamp *fileStamp) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	*stamp = stampOf(fi)
	return os.ReadFile(path)
}

func stampOf(fi os.FileInfo) fileStamp {
	s := fileStamp{mod: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// hasPEM reports whether data holds a PEM block whose type is wanted.
func hasPEM(data []byte, wanted func(string) bool) bool {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return false
		}
		if wanted(b.Type) {
			return true
		}
	}
}
