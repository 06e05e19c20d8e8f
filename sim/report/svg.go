package report

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// palette colours baselines and workloads (colour-blind-safe Tableau 10).
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// Font metrics: the plots use the viewer's sans-serif font, whose widths
// the SVG cannot know; layouts reserve room for text by charWidth, an
// estimate per character at least as wide as DejaVu Sans (the widest of
// the common sans-serif fonts, Linux's default) sets it, and Liberation
// Sans, Helvetica and Arial less so, so that text placed by it is never
// clipped nor runs into its neighbours (TestSVGLayoutInBrowser measures
// the plots as Chromium lays them out). Bold text is wider still.
const (
	fontSize  = 12
	boldWidth = 1.1
)

// charWidth is the width of r in em, by class: DejaVu Sans sets i and l
// at 0.28 em, most lower-case letters and digits at 0.55–0.64, upper case
// at 0.6–0.8, m, w, M and W at 0.82–1.0, + = < > ~ # & and symbols such
// as ≥ at 0.78–0.84, and CJK characters at 1.
func charWidth(r rune) float64 {
	switch {
	case strings.ContainsRune("iljtfI.,:;'!|() []", r):
		return 0.42
	case strings.ContainsRune("mwMW@%", r):
		return 1.0
	case strings.ContainsRune("+=<>~#&", r): // 0.78–0.84 em
		return 0.85
	case r >= 'A' && r <= 'Z':
		return 0.8
	case r >= 0x2e80:
		return 1.0
	case r > 0x7f: // symbols: ≥ and × are 0.84 em
		return 0.85
	}
	return 0.65
}

// textWidth estimates the width in pixels of s set at size px.
func textWidth(s string, size float64) float64 {
	w := 0.0
	for _, r := range s {
		w += charWidth(r)
	}
	return w * size
}

// canvas builds an SVG document whose size is fixed only at the end, from
// what was drawn, so that no text falls outside it.
type canvas struct {
	body       bytes.Buffer
	maxX, maxY float64
}

// extend grows the drawing's extent to include x, y.
func (c *canvas) extend(x, y float64) {
	c.maxX, c.maxY = max(c.maxX, x), max(c.maxY, y)
}

// text draws s with its baseline at y, anchored start, middle or end at x;
// attrs are extra attributes (font weight, colour).
func (c *canvas) text(x, y float64, anchor, s string, size float64, attrs string) {
	w := textWidth(s, size)
	if strings.Contains(attrs, "bold") {
		w *= boldWidth
	}
	right := x + w
	switch anchor {
	case "middle":
		right = x + w/2
	case "end":
		right = x
	}
	c.extend(right, y+size*0.3)
	sz := ""
	if size != fontSize {
		sz = fmt.Sprintf(` font-size="%s"`, num(size))
	}
	anc := ""
	if anchor != "start" {
		anc = fmt.Sprintf(` text-anchor="%s"`, anchor)
	}
	fmt.Fprintf(&c.body, `<text x="%s" y="%s"%s%s%s>%s</text>`+"\n", num(x), num(y), anc, sz, attrs, html.EscapeString(s))
}

// vtext draws s turned a quarter left (reading upwards), centred on x, y.
func (c *canvas) vtext(x, y float64, s string) {
	h := textWidth(s, fontSize)
	c.extend(x+fontSize*0.3, y+h/2)
	fmt.Fprintf(&c.body, `<text x="%s" y="%s" text-anchor="middle" transform="rotate(-90 %s %s)">%s</text>`+"\n",
		num(x), num(y), num(x), num(y), html.EscapeString(s))
}

// line draws a line; attrs set its stroke.
func (c *canvas) line(x1, y1, x2, y2 float64, attrs string) {
	c.extend(max(x1, x2), max(y1, y2))
	fmt.Fprintf(&c.body, `<line x1="%s" y1="%s" x2="%s" y2="%s" %s/>`+"\n", num(x1), num(y1), num(x2), num(y2), attrs)
}

// rect draws a rectangle; attrs set its fill and stroke; title, if not
// empty, is shown on hover.
func (c *canvas) rect(x, y, w, h float64, attrs, title string) {
	c.extend(x+w, y+h)
	if title == "" {
		fmt.Fprintf(&c.body, `<rect x="%s" y="%s" width="%s" height="%s" %s/>`+"\n", num(x), num(y), num(w), num(h), attrs)
		return
	}
	fmt.Fprintf(&c.body, `<rect x="%s" y="%s" width="%s" height="%s" %s><title>%s</title></rect>`+"\n",
		num(x), num(y), num(w), num(h), attrs, html.EscapeString(title))
}

// polyline draws connected points.
func (c *canvas) polyline(pts [][2]float64, attrs string) {
	c.body.WriteString(`<polyline fill="none" ` + attrs + ` points="`)
	for i, p := range pts {
		if i > 0 {
			c.body.WriteByte(' ')
		}
		c.extend(p[0], p[1])
		c.body.WriteString(num(p[0]) + "," + num(p[1]))
	}
	c.body.WriteString(`"/>` + "\n")
}

// writeTo writes the document with a margin around the drawing.
func (c *canvas) writeTo(w io.Writer) error {
	width, height := math.Ceil(c.maxX+margin), math.Ceil(c.maxY+margin)
	var out bytes.Buffer
	fmt.Fprintf(&out, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="%d">`+"\n",
		num(width), num(height), num(width), num(height), fontSize)
	out.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	out.Write(c.body.Bytes())
	out.WriteString("</svg>\n")
	_, err := w.Write(out.Bytes())
	return err
}

// margin is the white space kept right of and below the drawing.
const margin = 12

// num formats a coordinate with at most one decimal.
func num(v float64) string {
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}
