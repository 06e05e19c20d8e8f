package web

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestOpenAPIMatchesRoutes: the OpenAPI description names exactly the
// routes the server registers, method by method, and docs/openapi.yaml is
// the same file.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := yaml.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	var whole map[string]any
	if err := yaml.Unmarshal(openAPI, &whole); err != nil {
		t.Fatal(err)
	}
	checkRefs(t, whole, whole)
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi version %q", doc.OpenAPI)
	}
	var described []string
	for path, ops := range doc.Paths {
		for method := range ops {
			described = append(described, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(described)

	f := newFixture(t, 1, Limits{})
	param := regexp.MustCompile(`:(\w+)`)
	var registered []string
	for _, r := range f.s.Routes() {
		registered = append(registered, param.ReplaceAllString(r, "{$1}"))
	}
	slices.Sort(registered)
	for _, r := range registered {
		if !slices.Contains(described, r) {
			t.Errorf("route %s is not in openapi.yaml", r)
		}
	}
	for _, d := range described {
		if !slices.Contains(registered, d) {
			t.Errorf("openapi.yaml describes %s, which the server does not register", d)
		}
	}
	if len(registered) < 18 {
		t.Errorf("only %d routes: %v", len(registered), registered)
	}
	docs, err := os.ReadFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(docs, openAPI) {
		t.Error("docs/openapi.yaml differs from web/openapi.yaml: copy web/openapi.yaml over it")
	}
}

// checkRefs requires every local $ref under v to resolve in root.
func checkRefs(t *testing.T, root map[string]any, v any) {
	t.Helper()
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k != "$ref" {
				checkRefs(t, root, e)
				continue
			}
			ref, _ := e.(string)
			var at any = root
			for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
				m, _ := at.(map[string]any)
				at = m[part]
			}
			if !strings.HasPrefix(ref, "#/") || at == nil {
				t.Errorf("$ref %q does not resolve", ref)
			}
		}
	case []any:
		for _, e := range x {
			checkRefs(t, root, e)
		}
	}
}
