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

// TestPackageBoundaries guards the seams inside the safekeeper process and
// around its command line (docs/architecture.md):
//
//   - server/timeline, the timeline host, imports neither the wire
//     transport (proto/pgwire) nor the HTTP surface (server/httpapi): it
//     speaks in proto messages, acceptor states and its own errors, and
//     the front doors give those their SQLSTATEs and statuses;
//   - server/httpapi does not import server: it reads the timelines
//     through the registry and the process through its Host interface;
//   - cmd/safekeeper imports neither storage nor acceptor: it turns flags
//     into a package's Config and prints; what reads or writes a data
//     directory is a package's API;
//   - nothing imports cmd (test files included).
//
// Direct imports of production files, as TestPurePackagesDoNoIO checks.
func TestPackageBoundaries(t *testing.T) {
	const self = "github.com/safekeeper/safekeeper/"
	for dir, forbidden := range map[string][]string{
		"server/timeline": {"proto/pgwire", "server/httpapi", "server"},
		"server/httpapi":  {"server"},
		"cmd/safekeeper":  {"storage", "acceptor"},
	} {
		no := map[string]bool{}
		for _, p := range forbidden {
			no[self+p] = true
		}
		imports, checked := goImports(t, filepath.Join("..", dir), false)
		if checked == 0 {
			t.Errorf("%s: no source files checked", dir)
		}
		for file, paths := range imports {
			for _, path := range paths {
				if no[path] {
					t.Errorf("%s/%s imports %s; %s may not import %v of ours", dir, file, path, dir, forbidden)
				}
			}
		}
	}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			return nil
		}
		imports, _ := goImports(t, path, true)
		for file, paths := range imports {
			for _, p := range paths {
				if p == self+"cmd" || strings.HasPrefix(p, self+"cmd/") {
					t.Errorf("%s imports %s: nothing imports cmd", filepath.Join(path, file), p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// goImports returns the import paths of every Go file of dir (its test
// files too when withTests), by file name, and how many files it read.
func goImports(t *testing.T, dir string, withTests bool) (map[string][]string, int) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || (!withTests && strings.HasSuffix(name, "_test.go")) {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = []string{}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			out[name] = append(out[name], path)
		}
	}
	return out, len(out)
}
