// Package console is Arbiter's web console: the static pages, scripts and
// styles of the browser UI, embedded in the binary so that a node needs no
// network access to show it. Package web mounts Handler at "/"; the
// console reads everything it shows from web's API under /api/v1 and its
// event stream.
//
// Everything the console loads comes from this package (no CDN, no inline
// script or style), so it runs under the Content-Security-Policy
// "default-src 'self'". The charting library, uPlot, is vendored under
// vendor/ with its licence; the policy editor's highlighting is the
// console's own.
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static vendor
var files embed.FS

// CSP is the Content-Security-Policy the console is written for and that
// Handler sets on every response: nothing but the console's own origin.
const CSP = "default-src 'self'"

// Handler serves the console: index.html at "/", its scripts and styles
// under /static/ and the vendored libraries under /vendor/. Every
// response carries an ETag (the file's SHA-256), so a browser revalidates
// instead of downloading again, and the console's CSP.
func Handler() http.Handler {
	h := &handler{assets: map[string]asset{}}
	err := fs.WalkDir(files, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		h.assets["/"+name] = asset{body: b, etag: `"` + hex.EncodeToString(sum[:12]) + `"`, ctype: contentType(name)}
		return nil
	})
	if err != nil {
		// The files are embedded at build time: reading them cannot fail
		// unless the binary itself is broken.
		panic(fmt.Sprintf("console: read embedded files: %v", err))
	}
	h.assets["/"] = h.assets["/static/index.html"]
	return h
}

// asset is one embedded file, ready to serve.
type asset struct {
	body  []byte
	etag  string
	ctype string
}

type handler struct {
	assets map[string]asset
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "console: only GET and HEAD are served here", http.StatusMethodNotAllowed)
		return
	}
	p := path.Clean("/" + r.URL.Path)
	if p == "/index.html" {
		p = "/"
	}
	a, ok := h.assets[p]
	if !ok || strings.HasSuffix(p, "/") && p != "/" {
		http.Error(w, fmt.Sprintf("console: no file %q; the console starts at /", r.URL.Path), http.StatusNotFound)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", a.ctype)
	hd.Set("ETag", a.etag)
	hd.Set("Cache-Control", "no-cache")
	hd.Set("Content-Security-Policy", CSP)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	http.ServeContent(w, r, p, time.Time{}, strings.NewReader(string(a.body)))
}

// contentType is the file's MIME type by extension; the system's MIME
// tables are not consulted, so every node serves the same types.
func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".png":
		return "image/png"
	case ".md", "", ".txt":
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}
