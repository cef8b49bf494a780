package harness

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Knobs reads a benchmark's integer knobs from the environment (BENCH_*),
// the defaults of its flags. A variable that does not parse keeps the
// default and is kept for Err, which the benchmark fails on: a flag's
// default cannot fail by itself.
type Knobs struct{ errs []error }

// Int is the environment variable name as an integer, def when it is
// unset or empty.
func (k *Knobs) Int(name string, def int) int {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		k.errs = append(k.errs, fmt.Errorf("%s=%q is not an integer", name, v))
		return def
	}
	return n
}

// Err names every variable that did not parse; nil when all did.
func (k *Knobs) Err() error { return errors.Join(k.errs...) }
