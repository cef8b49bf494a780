package acceptor

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestAcceptorDoesNoIO guards the package boundary: the acceptor is a pure
// state machine, so its code imports no network, file system, clock or
// bbolt package. (Imports of imports are not checked: fmt uses os for
// Printf, which the acceptor never calls.)
func TestAcceptorDoesNoIO(t *testing.T) {
	forbidden := map[string]bool{"net": true, "os": true, "time": true, "go.etcd.io/bbolt": true,
		"os/exec": true, "syscall": true, "math/rand": true, "math/rand/v2": true, "log/slog": true,
		"github.com/safekeeper/safekeeper/storage": true, "github.com/safekeeper/safekeeper/proto/pgwire": true}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if forbidden[path] || strings.HasPrefix(path, "net/") {
				t.Errorf("%s imports %s", name, path)
			}
		}
	}
}
