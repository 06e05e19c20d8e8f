package uprobe

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// The dynamic linker's cache (/etc/ld.so.cache, glibc ≥ 2.32 writes only
// the new format; older ones prefix it with the old "ld.so-1.7.0" table).
const (
	ldCacheOldMagic = "ld.so-1.7.0"
	ldCacheNewMagic = "glibc-ld.so.cache1.1"
	// new format header: magic+version (20), nlibs, len_strings, flags and
	// padding (4), extension offset, 3 unused words.
	ldCacheNewHeader = 48
	ldCacheNewEntry  = 24
	ldCacheOldEntry  = 12
)

// LdCacheError says where an ld.so.cache could not be parsed.
type LdCacheError struct {
	Offset int
	Reason string
}

// Error names the byte offset and the fault.
func (e *LdCacheError) Error() string {
	return fmt.Sprintf("parse ld.so.cache: byte %d: %s", e.Offset, e.Reason)
}

// parseLdCache returns the (name, path) entries of an ld.so.cache image.
func parseLdCache(data []byte) ([][2]string, error) {
	base := 0
	if bytes.HasPrefix(data, []byte(ldCacheOldMagic)) {
		// Old table: magic (11, padded to 12), nlibs, entries; the new
		// table follows, 8-byte aligned.
		if len(data) < 16 {
			return nil, &LdCacheError{Offset: len(data), Reason: "truncated old-format header"}
		}
		n := int(binary.LittleEndian.Uint32(data[12:]))
		if n < 0 || n > len(data)/ldCacheOldEntry {
			return nil, &LdCacheError{Offset: 12, Reason: fmt.Sprintf("old-format entry count %d exceeds the file", n)}
		}
		base = (16 + n*ldCacheOldEntry + 7) &^ 7
		if base >= len(data) {
			return nil, nil // old format only: nothing we read
		}
	}
	d := data[base:]
	if !bytes.HasPrefix(d, []byte(ldCacheNewMagic)) {
		return nil, &LdCacheError{Offset: base, Reason: "no " + ldCacheNewMagic + " header"}
	}
	if len(d) < ldCacheNewHeader {
		return nil, &LdCacheError{Offset: len(data), Reason: "truncated header"}
	}
	n := int(binary.LittleEndian.Uint32(d[20:]))
	if n < 0 || n > (len(d)-ldCacheNewHeader)/ldCacheNewEntry {
		return nil, &LdCacheError{Offset: base + 20, Reason: fmt.Sprintf("entry count %d exceeds the file", n)}
	}
	// String offsets are relative to the new header in a combined file
	// and to the file start in a new-only one: both are base.
	str := func(off uint32, at int) (string, error) {
		o := base + int(off)
		if int(off) < 0 || o >= len(data) {
			return "", &LdCacheError{Offset: at, Reason: fmt.Sprintf("string offset %d outside the file", off)}
		}
		end := bytes.IndexByte(data[o:], 0)
		if end < 0 {
			return "", &LdCacheError{Offset: at, Reason: "unterminated string"}
		}
		return string(data[o : o+end]), nil
	}
	out := make([][2]string, 0, n)
	for i := 0; i < n; i++ {
		at := base + ldCacheNewHeader + i*ldCacheNewEntry
		e := data[at : at+ldCacheNewEntry]
		key, err := str(binary.LittleEndian.Uint32(e[4:]), at+4)
		if err != nil {
			return nil, err
		}
		val, err := str(binary.LittleEndian.Uint32(e[8:]), at+8)
		if err != nil {
			return nil, err
		}
		out = append(out, [2]string{key, val})
	}
	return out, nil
}
