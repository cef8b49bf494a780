package ingest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// DD runs the baseline `dd if=/dev/zero of=dir/dd.out bs=bs count=count
// oflag=dsync`: every block written with O_DSYNC, so each write returns
// once it is on stable storage, as a safekeeper must before it answers. It
// returns the time dd took (process start included, a millisecond) and
// removes the file.
func DD(ctx context.Context, dir string, bs, count int) (time.Duration, error) {
	path := filepath.Join(dir, "dd.out")
	defer os.Remove(path)
	cmd := exec.CommandContext(ctx, "dd", "if=/dev/zero", "of="+path, "bs="+strconv.Itoa(bs), "count="+strconv.Itoa(count), "oflag=dsync")
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("%v: %v\n%s", cmd.Args, err, out)
	}
	return d, nil
}

// DDCommand is the command line DD runs, for the report.
func DDCommand(bs, count int) string {
	b := strconv.Itoa(bs)
	if bs%1024 == 0 {
		b = strconv.Itoa(bs/1024) + "k"
	}
	return fmt.Sprintf("dd if=/dev/zero of=<temp dir>/dd.out bs=%s count=%d oflag=dsync", b, count)
}
