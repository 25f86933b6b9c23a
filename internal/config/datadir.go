package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/layout"
)

// dataDirEnv names the data dir like --data-dir does.
const dataDirEnv = "KELP_DATA_DIR"

// DataDirFlag is --data-dir, by which every command names the node it is
// for: kelp server and agent, and the tools that act on a node (kelp
// token, killall, snapshot, certificate, secrets-encrypt). A command that
// has it has ConfigFlag too, so that WithFileArgs gives it the config
// file's data-dir: the flag, then KELP_DATA_DIR, then the config file,
// then the default, as ResolveDataDir has it for the tools whose
// arguments kelp does not parse.
func DataDirFlag() *cli.StringFlag {
	return &cli.StringFlag{Name: "data-dir", Aliases: []string{"d"}, EnvVars: []string{dataDirEnv}, Value: layout.DefaultDataDir,
		Usage: "the node's data dir: its state, certificates and unpacked bundle (else data-dir in the config file)"}
}

// NodeFlags are the flags of a tool that acts on a node: --config and
// --data-dir, which name the node the same way for every command.
func NodeFlags() []cli.Flag {
	return []cli.Flag{ConfigFlag(), DataDirFlag()}
}

// DataDir is the data dir that a command with NodeFlags was given,
// absolute (a relative one is taken from the current directory).
func DataDir(c *cli.Context) (string, error) {
	dir := c.String("data-dir")
	if dir == "" {
		return "", fmt.Errorf("--data-dir is empty: give the data dir of the node (default %s)", layout.DefaultDataDir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("--data-dir %s: %w", dir, err)
	}
	return abs, nil
}

// Lookup is where ResolveDataDir looks besides the command line: an
// environment (the process's own, or one read from /proc), the file
// system at "/" and the directory a relative --config or data dir is
// taken from.
type Lookup struct {
	Getenv func(string) string
	FS     fs.FS
	Cwd    string
}

// ResolveDataDir is the data dir of a command whose arguments kelp does not
// parse itself (etcdctl, crictl, ctr, and the kelp processes killall
// reads), in the order WithFileArgs and DataDirFlag give it to the others:
// given (the command's --data-dir, "" if none), else KELP_DATA_DIR, else
// data-dir of the config files (--config or -c in args, else
// KELP_CONFIG_FILE, else /etc/kelp/config.yaml, with their .d drop-ins),
// else /var/lib/kelp. The config files are read only when they decide.
// The result is absolute and clean.
func ResolveDataDir(given string, args []string, l Lookup) (string, error) {
	dir, err := ResolveFlag("data-dir", given, args, l)
	if err != nil {
		return "", err
	}
	if dir == "" {
		dir = layout.DefaultDataDir
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(l.Cwd, dir)
	}
	return filepath.Clean(dir), nil
}

// LeadingDataDir takes a leading --data-dir DIR (or --data-dir=DIR) off
// args, the arguments of a tool with flags of its own, and resolves the
// data dir with ResolveDataDir. Only the start is looked at because the
// tool's subcommands have flags of their own, and -d may be one of them
// (etcdctl's --discovery-srv).
func LeadingDataDir(args []string, l Lookup) (dataDir string, rest []string, err error) {
	given, rest, flag := "", args, false
	if len(args) > 0 {
		if v, ok := strings.CutPrefix(args[0], "--data-dir="); ok {
			given, rest, flag = v, args[1:], true
		} else if args[0] == "--data-dir" && len(args) > 1 {
			given, rest, flag = args[1], args[2:], true
		} else if args[0] == "--data-dir" {
			flag = true
		}
	}
	if flag && given == "" {
		return "", nil, errors.New("--data-dir needs a directory: give --data-dir DIR before the other arguments")
	}
	// The tool's own --config, if it has one, is not kelp's.
	dir, err := ResolveDataDir(given, nil, l)
	return dir, rest, err
}

// WithDataDir is an action of a command with NodeFlags that is given the
// command's data dir.
func WithDataDir(action func(c *cli.Context, dataDir string) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		dir, err := DataDir(c)
		if err != nil {
			return err
		}
		return action(c, dir)
	}
}

// ToolDataDir is LeadingDataDir for a tool of this process (crictl, ctr,
// etcdctl) given its arguments after the program name.
func ToolDataDir(args []string) (dataDir string, rest []string, err error) {
	l, err := ThisProcess()
	if err != nil {
		return "", nil, err
	}
	return LeadingDataDir(args, l)
}

// ThisProcess is the Lookup of this process: its environment, the file
// system at "/" and its current directory.
func ThisProcess() (Lookup, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return Lookup{}, fmt.Errorf("current directory: %w", err)
	}
	return Lookup{Getenv: os.Getenv, FS: os.DirFS("/"), Cwd: cwd}, nil
}

// ResolveFlag is, like ResolveDataDir, the value of flag name (without
// dashes) of a command whose arguments kelp could not parse: given (its
// value on the command line, "" if none), else its KELP_ variable, else
// the last value the config files give it; "" when none sets it.
func ResolveFlag(name, given string, args []string, l Lookup) (string, error) {
	if given != "" {
		return given, nil
	}
	for _, v := range env(name) {
		if val := l.Getenv(v); val != "" {
			return val, nil
		}
	}
	path, explicit := configPath(args, l.Getenv)
	if !filepath.IsAbs(path) {
		path = filepath.Join(l.Cwd, path)
	}
	settings, err := readConfigFiles(l.FS, filepath.Clean(path), explicit)
	if err != nil {
		return "", err
	}
	if v := settings[name].values; len(v) > 0 {
		return v[len(v)-1], nil
	}
	return "", nil
}
