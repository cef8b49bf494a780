package harness

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteDocSection rewrites one generated section of a document of the
// module (doc is its path from the module root, e.g. docs/performance.md):
// the text between the lines <!-- name:begin --> and <!-- name:end -->
// becomes body (ReplaceSection). The benchmarks write their reports so. It
// returns the file's path.
func WriteDocSection(doc, name, body string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	path := filepath.Join(root, filepath.FromSlash(doc))
	old, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	out, err := ReplaceSection(old, name, body)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return path, os.WriteFile(path, out, 0o644)
}

// ReplaceSection returns doc with the text between the markers
// <!-- name:begin --> and <!-- name:end --> replaced by body, trimmed of
// surrounding white space (the markers stay, each on its own line). The
// markers must each appear once, begin first.
func ReplaceSection(doc []byte, name, body string) ([]byte, error) {
	begin, end := []byte("<!-- "+name+":begin -->"), []byte("<!-- "+name+":end -->")
	i := bytes.Index(doc, begin)
	j := bytes.Index(doc, end)
	if i < 0 || j < 0 || j < i {
		return nil, fmt.Errorf("markers %s / %s not found in order", begin, end)
	}
	if bytes.Count(doc, begin) != 1 || bytes.Count(doc, end) != 1 {
		return nil, fmt.Errorf("markers of %s appear more than once", name)
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(begin)])
	out.WriteString("\n")
	out.WriteString(strings.TrimSpace(body))
	out.WriteString("\n")
	out.Write(doc[j:])
	return out.Bytes(), nil
}
