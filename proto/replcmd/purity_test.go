package replcmd_test

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestReplcmdIsPure guards the package boundary: the command language is a
// pure function of the query text, so its code imports the standard
// library, minus everything doing IO, and package proto (for LSN) — not the
// wire transport proto/pgwire, nor anything else of ours. (Test files may
// import more; imports of imports are not checked.)
func TestReplcmdIsPure(t *testing.T) {
	const self = "github.com/safekeeper/safekeeper/"
	allowedOurs := map[string]bool{self + "proto": true}
	forbiddenStd := map[string]bool{"os": true, "syscall": true, "time": true, "io": true, "bufio": true,
		"log": true, "log/slog": true, "math/rand": true, "math/rand/v2": true, "crypto/rand": true,
		"unsafe": true, "runtime": true, "embed": true, "plugin": true}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			std := !strings.Contains(first, ".")
			switch {
			case std && (forbiddenStd[path] || first == "net" || first == "os" || first == "io"):
				t.Errorf("%s imports %s, which does IO", name, path)
			case !std && !allowedOurs[path]:
				t.Errorf("%s imports %s; replcmd may import only the standard library and %sproto", name, path, self)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
