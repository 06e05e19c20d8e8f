package web

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// tokenBytes is the entropy of a generated token: 256 bits.
const tokenBytes = 32

// LoadOrCreateToken returns the API token stored at path, creating it on
// first start: 256 random bits (crypto/rand) as hex, in a file of mode
// 0600 whose directory is created with mode 0700. A token file that others
// can read or write is refused, not silently fixed: a token that may have
// leaked must be replaced by whoever reads this error.
func LoadOrCreateToken(path string) ([]byte, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("web: create the token directory %s: %w", filepath.Dir(path), err)
	}
	tok, err := readToken(path)
	if !errors.Is(err, os.ErrNotExist) {
		return tok, err
	}
	raw := make([]byte, tokenBytes)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("web: generate API token: %w", err)
	}
	tok = []byte(hex.EncodeToString(raw))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return readToken(path) // another process created it first
	}
	if err != nil {
		return nil, fmt.Errorf("web: create the token file %s: %w", path, err)
	}
	_, werr := f.Write(append(tok, '\n'))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return nil, fmt.Errorf("web: write the token file %s: %w", path, werr)
	}
	return tok, nil
}

func readToken(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("web: token file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("web: token file %s has mode %04o: others may have read it; delete it so that a new token is made, or chmod 600 it if it never left this node", path, perm)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("web: read the token file %s: %w", path, err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) < 32 {
		return nil, fmt.Errorf("web: token file %s holds %d characters, fewer than 32: delete it so that a new token is made", path, len(tok))
	}
	return tok, nil
}
