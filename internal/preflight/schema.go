package preflight

import (
	_ "embed"
	"slices"
)

// FormatVersion is the version of the JSON document `arbiter doctor
// --format json` prints, in its format_version field. It changes when a
// field is removed or renamed or changes its meaning; a new field, check
// or enforcement level does not change it.
const FormatVersion = 1

// schemaJSON is the JSON Schema (draft 2020-12) of Document;
// docs/doctor.schema.json is the same file, for readers of the docs.
//
//go:embed doctor.schema.json
var schemaJSON []byte

// Schema returns the JSON Schema (draft 2020-12) of Document, the JSON
// `arbiter doctor --format json` prints; `arbiter doctor --schema` prints
// it.
func Schema() []byte { return slices.Clone(schemaJSON) }

// Document is a report in the form `arbiter doctor --format json` prints
// and Schema describes.
type Document struct {
	// FormatVersion is FormatVersion.
	FormatVersion int            `json:"format_version"`
	Checks        []Check        `json:"checks"`
	Levels        []LevelSupport `json:"levels"`
	// Ready is Report.Ready.
	Ready bool `json:"ready"`
}

// Document returns the report as `arbiter doctor --format json` prints it.
func (r *Report) Document() Document {
	return Document{FormatVersion: FormatVersion, Checks: r.Checks, Levels: r.Levels, Ready: r.Ready()}
}

// Ready reports whether the node can capture CUDA calls: whether the
// observe level, which every other level builds on, is supported.
func (r *Report) Ready() bool { return r.Level(Observe).Supported }
