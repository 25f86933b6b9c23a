// Package procstat reads a process's /proc/PID/stat, whose command name
// may hold spaces and parentheses: what follows its last ')' is fields.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is what kelp reads of a process's stat.
type Stat struct {
	Comm      string // the command name, up to 15 bytes
	State     string // "R", "S", "Z"…
	PPid      int
	StartTime uint64 // clock ticks after boot
}

// Alive says whether the process had not exited: neither zombie nor dead.
func (s Stat) Alive() bool { return s.State != "Z" && s.State != "X" }

// Read reads the stat of process pid.
func Read(pid int) (Stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return Parse(data)
}

// Parse reads a stat file's content.
func Parse(data []byte) (Stat, error) {
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	// After the command: the state is field 3, the parent 4, the start
	// time 22.
	var f []string
	if open >= 0 && end > open {
		f = strings.Fields(string(data[end+1:]))
	}
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("malformed process stat %q", data)
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return Stat{}, fmt.Errorf("malformed process stat %q", data)
	}
	return Stat{Comm: string(data[open+1 : end]), State: f[0], PPid: ppid, StartTime: start}, nil
}
