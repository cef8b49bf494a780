package test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPurePackagesDoNoIO guards the boundaries that let the same code run
// behind a socket and inside the deterministic simulation: the protocol
// core (acceptor), the proposer's decisions (proposer/session), the
// messages (proto), the command language (proto/replcmd) and the WAL
// decoder (proto/xlog) import the standard
// library minus everything doing IO, reading a clock or randomness, and
// only the packages of ours listed — never storage, the wire transport
// proto/pgwire or bbolt. (Test files may import more; imports of imports
// are not checked: fmt uses os for Printf, which these never call.)
func TestPurePackagesDoNoIO(t *testing.T) {
	const self = "github.com/safekeeper/safekeeper/"
	forbiddenStd := map[string]bool{"os": true, "syscall": true, "time": true, "io": true, "bufio": true,
		"log": true, "log/slog": true, "math/rand": true, "math/rand/v2": true, "crypto/rand": true,
		"unsafe": true, "runtime": true, "embed": true, "plugin": true}
	for dir, ours := range map[string][]string{
		"acceptor":         {"proto", "proto/xlog"},
		"proposer/session": {"proto"},
		"proto":            nil,
		"proto/replcmd":    {"proto"},
		"proto/xlog":       {"proto"},
	} {
		allowed := map[string]bool{}
		for _, p := range ours {
			allowed[self+p] = true
		}
		entries, err := os.ReadDir(filepath.Join("..", dir))
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, e := range entries {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", dir, name), nil, parser.ImportsOnly)
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
					t.Errorf("%s/%s imports %s, which does IO", dir, name, path)
				case !std && !allowed[path]:
					t.Errorf("%s/%s imports %s; it may import only the standard library and %v of ours", dir, name, path, ours)
				}
			}
		}
		if checked == 0 {
			t.Errorf("%s: no source files checked", dir)
		}
	}
}
