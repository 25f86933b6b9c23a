package bootguard

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/version"
)

// defaultAttempts is --upgrade-attempts when Unstarted cannot tell.
const defaultAttempts = 3

// counted wraps the error of a start the guard counted, or kept from
// starting (the lock), so that Unstarted does not count it again.
type counted struct{ err error }

func (c counted) Error() string { return c.err.Error() }
func (c counted) Unwrap() error { return c.err }

func markCounted(err error) error {
	if err == nil {
		return nil
	}
	return counted{err}
}

// Counted says that the guard saw the start that err ended.
func Counted(err error) bool {
	var c counted
	return errors.As(err, &c)
}

// Before is the kelp that ran the data dir before, for when no kelp became
// ready on it under the guard: on a server, the one versions.json names;
// on a node that joined a cluster (an agent), one not known. nil: none ran
// it.
func Before(dataDir, role string) (*version.Ran, error) {
	if role == "agent" {
		if _, err := os.Stat(layout.Agent(dataDir).SavedJoin); err == nil {
			return &version.Ran{}, nil
		}
		return nil, nil
	}
	last, ok, err := version.ReadDataDir(layout.Server(dataDir).Versions)
	if err != nil || !ok {
		return nil, err
	}
	return &last, nil
}

// Unstarted counts a start of `kelp server` or `kelp agent` (args are
// the process's, from the program's name on) that err ended before the
// server or agent ran, and so before Begin: a new kelp that refuses the
// flags or the config file the old one took has not become ready either,
// and is rolled back like one that failed later. It returns err, or
// ErrRolledBack. Anything else is left alone: another command, a start
// the guard saw, a --cluster-reset, a data dir that does not exist.
func Unstarted(args []string, err error) error {
	if err == nil || Counted(err) || len(args) < 2 || os.Geteuid() != 0 {
		return err
	}
	role, rest := args[1], args[2:]
	if role != "server" && role != "agent" {
		return err
	}
	l, lerr := config.ThisProcess()
	if lerr != nil {
		return err
	}
	if reset, _ := config.ResolveFlag("cluster-reset", flagValue(rest, true, "cluster-reset"), rest, l); reset != "" && reset != "false" {
		return err
	}
	dataDir, derr := config.ResolveDataDir(flagValue(rest, false, "data-dir", "d"), rest, l)
	if derr != nil {
		return err
	}
	if _, serr := os.Stat(dataDir); serr != nil {
		return err
	}
	attempts := defaultAttempts
	if v, _ := config.ResolveFlag("upgrade-attempts", flagValue(rest, false, "upgrade-attempts"), rest, l); v != "" {
		if n, aerr := strconv.Atoi(v); aerr == nil && n >= 0 {
			attempts = n
		}
	}
	before, berr := Before(dataDir, role)
	binary, xerr := os.Executable()
	if berr != nil || xerr != nil {
		return err
	}
	g, gerr := Begin(Config{DataDir: dataDir, Role: role, Running: version.Current(), Before: before, Attempts: attempts, Binary: binary})
	if errors.Is(gerr, ErrRolledBack) {
		return gerr
	}
	if gerr != nil {
		return err
	}
	defer g.Close()
	return g.Finish(err)
}

// flagValue is the last value args give the flag of one of names (without
// dashes), as "--name value" or "--name=value" with one dash or two, up
// to "--"; a bool flag given as "--name" is "true".
func flagValue(args []string, isBool bool, names ...string) string {
	value := ""
	for i := 0; i < len(args) && args[i] != "--"; i++ {
		name, v, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-"), "=")
		if !strings.HasPrefix(args[i], "-") || !slices.Contains(names, name) {
			continue
		}
		switch {
		case hasValue:
			value = v
		case isBool:
			value = "true"
		case i+1 < len(args):
			i++
			value = args[i]
		}
	}
	return value
}
