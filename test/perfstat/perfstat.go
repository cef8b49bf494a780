package perfstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Counts are the events one perf stat run counted: task-clock in µs, the
// others in occurrences. An event perf did not count is absent.
type Counts map[string]float64

// Parse reads the output of perf stat -x, (the -o file): one line per
// event, "value,unit,event,run time,percentage,metric,metric unit";
// comments ("# started on …"), blank lines and perf's "Events enabled"
// notices are skipped, "<not counted>" and "<not supported>" values leave
// the event out. task-clock (msec) comes back in µs. No counted event at
// all is an error.
func Parse(out []byte) (Counts, error) {
	c := Counts{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || !strings.Contains(line, ",") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) < 3 {
			return nil, fmt.Errorf("line %d: %d fields, want at least 3: %q", n, len(f), line)
		}
		value, unit, event := f[0], f[1], f[2]
		if strings.HasPrefix(value, "<") { // <not counted>, <not supported>
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: value %q of %s: %v", n, value, event, err)
		}
		switch unit {
		case "msec":
			v *= 1000
		case "usec":
		case "nsec":
			v /= 1000
		case "":
		default:
			return nil, fmt.Errorf("line %d: unit %q of %s", n, unit, event)
		}
		c[event] += v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(c) == 0 {
		return nil, errors.New("perf stat counted no event")
	}
	return c, nil
}

// Session is perf stat attached to one process, its counters disabled
// until Control("enable").
type Session struct {
	cmd      *exec.Cmd
	ctl, ack *os.File // perf's control and acknowledgement pipes (our ends)
	outFile  string
	stderr   bytes.Buffer
}

// Start runs perf (its path) stat -p pid counting events, with its
// counters disabled; its output goes to a file in dir, removed by Finish
// and Abort.
func Start(perf string, events []string, pid int, dir string) (*Session, error) {
	s := &Session{outFile: filepath.Join(dir, fmt.Sprintf("perf-%d.csv", pid))}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	// In the child, ExtraFiles[0] is fd 3 and ExtraFiles[1] fd 4.
	s.cmd = exec.Command(perf, "stat", "-x,", "-o", s.outFile, "--control", "fd:3,4", "-D", "-1",
		"-e", strings.Join(events, ","), "-p", strconv.Itoa(pid))
	s.cmd.ExtraFiles = []*os.File{ctlR, ackW}
	s.cmd.Stderr = &s.stderr
	err = s.cmd.Start()
	ctlR.Close()
	ackW.Close()
	if err != nil {
		ctlW.Close()
		ackR.Close()
		return nil, err
	}
	s.ctl, s.ack = ctlW, ackR
	return s, nil
}

// Control sends perf one command (ping, enable, disable) and waits for
// its ack, at most timeout. The ack of ping means perf has attached.
func (s *Session) Control(command string, timeout time.Duration) error {
	if _, err := s.ctl.Write([]byte(command + "\n")); err != nil {
		return fmt.Errorf("perf stat %s: %v (%s)", command, err, FirstLine(s.stderr.Bytes()))
	}
	if err := s.ack.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := s.ack.Read(buf)
	if err != nil {
		return fmt.Errorf("perf stat %s: no ack: %v (%s)", command, err, FirstLine(s.stderr.Bytes()))
	}
	if !bytes.HasPrefix(buf[:n], []byte("ack")) {
		return fmt.Errorf("perf stat %s: answered %q", command, buf[:n])
	}
	return nil
}

// Finish disables the counters, stops perf (SIGINT: it prints its counts
// and exits) and reads what it counted.
func (s *Session) Finish() (Counts, error) {
	errDisable := s.Control("disable", 30*time.Second)
	s.ctl.Close()
	s.ack.Close()
	s.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-done
		return nil, fmt.Errorf("perf stat did not exit after SIGINT (%s)", FirstLine(s.stderr.Bytes()))
	}
	defer os.Remove(s.outFile)
	if errDisable != nil {
		return nil, errDisable
	}
	out, err := os.ReadFile(s.outFile)
	if err != nil {
		return nil, fmt.Errorf("perf stat output: %v (%s)", err, FirstLine(s.stderr.Bytes()))
	}
	c, err := Parse(out)
	if err != nil {
		return nil, fmt.Errorf("perf stat output: %v", err)
	}
	return c, nil
}

// Abort stops perf without reading its counts (cleanup after a failure).
func (s *Session) Abort() {
	s.ctl.Close()
	s.ack.Close()
	s.cmd.Process.Kill()
	s.cmd.Wait()
	os.Remove(s.outFile)
}

// FirstLine is the first line of a tool's output, for an error message.
func FirstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}
