package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"

	"github.com/kelp-dev/kelp/internal/layout"
)

// configFileEnv names the config file like --config does.
const configFileEnv = "KELP_CONFIG_FILE"

// fileValue is one key of a config file, remembered with where it came from
// so that errors can point at it.
type fileValue struct {
	values []string
	file   string
	line   int
}

// WithFileArgs returns args with the settings of the command's config files
// inserted as flags right after the subcommand name, so that urfave/cli
// parses them like any other flag and later command-line flags override them.
// A scalar set in the environment is left out so that the environment beats
// the file; a list from the environment is appended after the file's. args is os.Args; commands without a "config" flag are untouched.
//
// It also stops urfave/cli from splitting the values of list flags at
// commas: kelp splits the lists it takes itself (List), and an extra flag
// for an upstream component keeps its commas
// (--kube-apiserver-arg enable-admission-plugins=NodeRestriction,EventRateLimit).
func WithFileArgs(app *cli.App, args []string) ([]string, error) {
	app.DisableSliceFlagSeparator = true
	cmdIndex, cmd, nested := findCommand(app, args)
	if cmd == nil || lookupFlag(cmd.Flags, "config") == nil {
		return args, nil
	}
	path, explicit := configPath(args[cmdIndex+1:], os.Getenv)
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	settings, err := readConfigFiles(os.DirFS("/"), path, explicit)
	if err != nil {
		return nil, err
	}
	// A tool beside the node (kelp snapshot save, kelp killall) takes the
	// keys of the node's config that it has flags for, such as data-dir;
	// the file is kelp server's or kelp agent's, which check every key.
	nodeCommand := !nested && (cmd.Name == "server" || cmd.Name == "agent")
	fileArgs, err := settingsToArgs(cmd.Flags, settings, !nodeCommand)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(args)+len(fileArgs))
	out = append(out, args[:cmdIndex+1]...)
	out = append(out, fileArgs...)
	return append(out, args[cmdIndex+1:]...), nil
}

// findCommand returns the position and definition of the subcommand in
// args, descending into nested subcommands (kelp snapshot save), and says
// whether it is nested.
func findCommand(app *cli.App, args []string) (int, *cli.Command, bool) {
	index, cmd, nested := 0, (*cli.Command)(nil), false
	commands := app.Commands
	for i := 1; i < len(args); i++ {
		if strings.HasPrefix(args[i], "-") {
			continue
		}
		sub := findSub(commands, args[i])
		if sub == nil {
			break
		}
		nested = cmd != nil
		index, cmd, commands = i, sub, sub.Subcommands
	}
	return index, cmd, nested
}

func findSub(commands []*cli.Command, name string) *cli.Command {
	for _, c := range commands {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// configPath finds --config/-c in the subcommand's arguments, then the
// environment, then falls back to the default file (which may be absent).
func configPath(args []string, getenv func(string) string) (path string, explicit bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		for _, name := range []string{"--config", "-c", "-config"} {
			if a == name && i+1 < len(args) {
				return args[i+1], true
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v, true
			}
		}
	}
	if v := getenv(configFileEnv); v != "" {
		return v, true
	}
	return layout.ConfigFile, false
}

// readConfigFiles reads path (absolute, in fsys at "/") and then
// path.d/*.yaml in lexical order. Later files override scalars of earlier
// ones and extend their lists.
func readConfigFiles(fsys fs.FS, path string, explicit bool) (map[string]fileValue, error) {
	settings := map[string]fileValue{}
	if _, err := fs.Stat(fsys, inFS(path)); err == nil {
		if err := readConfigFile(fsys, path, settings); err != nil {
			return nil, err
		}
	} else if explicit || !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	dropIns, err := fs.Glob(fsys, inFS(path)+".d/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("config directory %s.d: %w", path, err)
	}
	sort.Strings(dropIns)
	for _, f := range dropIns {
		if err := readConfigFile(fsys, "/"+f, settings); err != nil {
			return nil, err
		}
	}
	return settings, nil
}

// inFS names an absolute path in a file system rooted at "/".
func inFS(path string) string { return strings.TrimPrefix(path, "/") }

func readConfigFile(fsys fs.FS, path string, settings map[string]fileValue) error {
	data, err := fs.ReadFile(fsys, inFS(path))
	if err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config file %s is not valid YAML: %w (fix the file or move it away)", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("config file %s line %d: want a mapping of flag names to values, like \"cluster-cidr: 10.42.0.0/16\"", path, root.Line)
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, val := root.Content[i], root.Content[i+1]
		name := key.Value
		values, err := nodeValues(val)
		if err != nil {
			return fmt.Errorf("config file %s line %d: key %q: %w", path, key.Line, name, err)
		}
		prev, seen := settings[name]
		if seen && prev.file == path {
			return fmt.Errorf("config file %s line %d: key %q is repeated (first at line %d)", path, key.Line, name, prev.line)
		}
		if seen && val.Kind == yaml.SequenceNode {
			values = append(prev.values, values...)
		}
		settings[name] = fileValue{values: values, file: path, line: key.Line}
	}
	return nil
}

// nodeValues returns the scalar or the list of scalars of a YAML value.
func nodeValues(n *yaml.Node) ([]string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return []string{n.Value}, nil
	case yaml.SequenceNode:
		out := make([]string, 0, len(n.Content))
		for _, item := range n.Content {
			if item.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("list items must be plain values (line %d)", item.Line)
			}
			out = append(out, item.Value)
		}
		return out, nil
	default:
		return nil, errors.New("want a value or a list of values, not a mapping")
	}
}

// settingsToArgs checks every key against the command's flags and renders
// the settings as --name=value arguments in a stable order.
func settingsToArgs(flags []cli.Flag, settings map[string]fileValue, skipUnknown bool) ([]string, error) {
	names := make([]string, 0, len(settings))
	for name := range settings {
		names = append(names, name)
	}
	sort.Strings(names)
	var args []string
	for _, name := range names {
		s := settings[name]
		where := fmt.Sprintf("config file %s line %d", s.file, s.line)
		flag := lookupFlag(flags, name)
		if flag == nil && skipUnknown {
			continue
		}
		if flag == nil || name == "config" {
			return nil, fmt.Errorf("%s: unknown key %q (keys are the long flag names of the command, see --help)", where, name)
		}
		switch f := flag.(type) {
		case *cli.StringSliceFlag:
			for _, v := range append(s.values, envValue(f.EnvVars)...) {
				args = append(args, "--"+name+"="+v)
			}
			continue
		case *cli.BoolFlag:
			if len(s.values) != 1 {
				return nil, fmt.Errorf("%s: key %q takes true or false, not a list", where, name)
			}
			if _, err := strconv.ParseBool(s.values[0]); err != nil {
				return nil, fmt.Errorf("%s: key %q takes true or false, not %q", where, name, s.values[0])
			}
			if envSet(f.EnvVars) {
				continue
			}
		case *cli.IntFlag:
			if len(s.values) != 1 {
				return nil, fmt.Errorf("%s: key %q takes a number, not a list", where, name)
			}
			if _, err := strconv.Atoi(s.values[0]); err != nil {
				return nil, fmt.Errorf("%s: key %q takes a number, not %q", where, name, s.values[0])
			}
			if envSet(f.EnvVars) {
				continue
			}
		case *cli.StringFlag:
			if len(s.values) != 1 {
				return nil, fmt.Errorf("%s: key %q takes one value, not a list", where, name)
			}
			if envSet(f.EnvVars) {
				continue
			}
		default:
			return nil, fmt.Errorf("%s: key %q cannot be set from a config file", where, name)
		}
		args = append(args, "--"+name+"="+s.values[0])
	}
	return args, nil
}

func lookupFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		if f.Names()[0] == name {
			return f
		}
	}
	return nil
}

// envValue is the value of the first of vars that is set and not empty,
// as the one value it gives a list flag; none if none is. urfave/cli drops
// environment list values once a flag is given, so a list from a file
// would otherwise hide the environment instead of adding to it.
func envValue(vars []string) []string {
	for _, v := range vars {
		if val, ok := os.LookupEnv(v); ok && val != "" {
			return []string{val}
		}
	}
	return nil
}

// List is the items of a list flag whose values may each name several,
// comma-separated (--tls-san a,b, or KELP_TLS_SAN=a,b, as one value).
func List(values []string) []string {
	var items []string
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			if item = strings.TrimSpace(item); item != "" {
				items = append(items, item)
			}
		}
	}
	return items
}

func envSet(vars []string) bool {
	for _, v := range vars {
		if _, ok := os.LookupEnv(v); ok {
			return true
		}
	}
	return false
}
