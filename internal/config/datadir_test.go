package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/layout"
)

func getenvOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// TestLeadingDataDir: etcdctl, crictl and ctr take a leading --data-dir,
// else KELP_DATA_DIR, else the config file, else the default.
func TestLeadingDataDir(t *testing.T) {
	fsys := fstest.MapFS{"etc/kelp/config.yaml": {Data: []byte("data-dir: /srv/kelp\n")}}
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		fsys     fstest.MapFS
		wantDir  string
		wantRest []string
	}{
		{"default", []string{"get", "/a"}, nil, fstest.MapFS{}, layout.DefaultDataDir, []string{"get", "/a"}},
		{"config file", []string{"get", "/a"}, nil, fsys, "/srv/kelp", []string{"get", "/a"}},
		{"environment beats the file", []string{"get"}, map[string]string{"KELP_DATA_DIR": "/env"}, fsys, "/env", []string{"get"}},
		{"flag beats the environment", []string{"--data-dir", "/flag", "get"}, map[string]string{"KELP_DATA_DIR": "/env"}, fsys, "/flag", []string{"get"}},
		{"flag with =", []string{"--data-dir=/flag/", "member", "list"}, nil, fsys, "/flag", []string{"member", "list"}},
		{"relative flag, from the current directory", []string{"--data-dir", "kelp", "ps"}, nil, fsys, "/home/me/kelp", []string{"ps"}},
		{"KELP_CONFIG_FILE names the file", []string{"ps"}, map[string]string{"KELP_CONFIG_FILE": "other.yaml"}, fstest.MapFS{"home/me/other.yaml": {Data: []byte("data-dir: /other\n")}}, "/other", []string{"ps"}},
		{"a drop-in overrides the file", nil, nil, fstest.MapFS{"etc/kelp/config.yaml": {Data: []byte("data-dir: /srv/kelp\n")}, "etc/kelp/config.yaml.d/10-dir.yaml": {Data: []byte("data-dir: /srv/other\n")}}, "/srv/other", nil},
		{"a flag after the tool's arguments is the tool's", []string{"get", "--data-dir", "/x"}, nil, fstest.MapFS{}, layout.DefaultDataDir, []string{"get", "--data-dir", "/x"}},
		{"-d is the tool's (etcdctl --discovery-srv)", []string{"-d", "example.com", "get"}, nil, fstest.MapFS{}, layout.DefaultDataDir, []string{"-d", "example.com", "get"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, rest, err := LeadingDataDir(tc.args, Lookup{Getenv: getenvOf(tc.env), FS: tc.fsys, Cwd: "/home/me"})
			if err != nil {
				t.Fatal(err)
			}
			if dir != tc.wantDir || strings.Join(rest, " ") != strings.Join(tc.wantRest, " ") {
				t.Errorf("got %q %q, want %q %q", dir, rest, tc.wantDir, tc.wantRest)
			}
		})
	}
	for _, args := range [][]string{{"--data-dir"}, {"--data-dir="}, {"--data-dir", ""}} {
		if _, _, err := LeadingDataDir(args, Lookup{Getenv: getenvOf(nil), FS: fstest.MapFS{}, Cwd: "/"}); err == nil || !strings.Contains(err.Error(), "--data-dir needs a directory") {
			t.Errorf("%q: %v", args, err)
		}
	}
}

// TestResolveDataDirBadConfig: a config file that decides the data dir
// and cannot be read stops the command with the file's name; one that
// does not decide it is not read.
func TestResolveDataDirBadConfig(t *testing.T) {
	bad := fstest.MapFS{"etc/kelp/config.yaml": {Data: []byte("data-dir: [/srv\n")}}
	l := Lookup{Getenv: getenvOf(nil), FS: bad, Cwd: "/"}
	if _, err := ResolveDataDir("", nil, l); err == nil || !strings.Contains(err.Error(), "config file /etc/kelp/config.yaml is not valid YAML") {
		t.Errorf("malformed file: %v", err)
	}
	if dir, err := ResolveDataDir("/flag", nil, l); err != nil || dir != "/flag" {
		t.Errorf("malformed file under a flag: %q, %v", dir, err)
	}
	l.FS = fstest.MapFS{}
	if _, err := ResolveDataDir("", []string{"--config", "/etc/kelp/missing.yaml"}, l); err == nil || !strings.Contains(err.Error(), "config file /etc/kelp/missing.yaml") {
		t.Errorf("missing file given by --config: %v", err)
	}
	l.FS = fstest.MapFS{"etc/kelp/config.yaml": {Data: []byte("- data-dir\n")}}
	if _, err := ResolveDataDir("", nil, l); err == nil || !strings.Contains(err.Error(), "config file /etc/kelp/config.yaml line 1") {
		t.Errorf("not a mapping: %v", err)
	}
}

// TestDataDirSameEverywhere: a command with NodeFlags, top-level (kelp
// killall) or nested (kelp token rotate), parsed by urfave/cli after
// WithFileArgs, and ResolveDataDir for the tools whose arguments kelp does
// not parse, find the same data dir for every combination of flag,
// environment and config file.
func TestDataDirSameEverywhere(t *testing.T) {
	for _, tc := range []struct {
		name       string
		flag, env  string
		file       string // data-dir in the config file, "" for none
		want       string
		configFlag bool // the file is given by --config, not KELP_CONFIG_FILE
	}{
		{name: "default", want: layout.DefaultDataDir},
		{name: "config file", file: "/file", want: "/file"},
		{name: "config file by --config", file: "/file", want: "/file", configFlag: true},
		{name: "environment beats the file", env: "/env", file: "/file", want: "/env"},
		{name: "environment", env: "/env", want: "/env"},
		{name: "flag beats the environment and the file", flag: "/flag", env: "/env", file: "/file", want: "/flag"},
		{name: "flag beats the file", flag: "/flag", file: "/file", want: "/flag", configFlag: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			content := ""
			if tc.file != "" {
				// Keys of the server's config the tool has no flag for
				// are left to the server.
				content = "data-dir: " + tc.file + "\ncluster-init: true\n"
			}
			config := writeFile(t, filepath.Join(t.TempDir(), "config.yaml"), content)
			var args []string
			if tc.configFlag {
				args = append(args, "--config", config)
				t.Setenv(configFileEnv, "")
				os.Unsetenv(configFileEnv)
			} else {
				t.Setenv(configFileEnv, config)
			}
			t.Setenv(dataDirEnv, tc.env)
			if tc.env == "" {
				os.Unsetenv(dataDirEnv)
			}
			if tc.flag != "" {
				args = append(args, "--data-dir", tc.flag)
			}
			var got string
			action := WithDataDir(func(_ *cli.Context, dir string) error { got = dir; return nil })
			app := &cli.App{Name: "kelp", Writer: io.Discard, Commands: []*cli.Command{
				{Name: "killall", Flags: NodeFlags(), Action: action},
				{Name: "token", Subcommands: []*cli.Command{{Name: "rotate", Flags: NodeFlags(), Action: action}}},
			}}
			for _, cmd := range [][]string{{"kelp", "killall"}, {"kelp", "token", "rotate"}} {
				got = ""
				full, err := WithFileArgs(app, append(cmd, args...))
				if err == nil {
					err = app.Run(full)
				}
				if err != nil || got != tc.want {
					t.Errorf("%s: data dir %q, %v; want %q", strings.Join(cmd, " "), got, err, tc.want)
				}
			}
			fsys := os.DirFS("/")
			cwd, _ := os.Getwd()
			dir, err := ResolveDataDir(tc.flag, args, Lookup{Getenv: os.Getenv, FS: fsys, Cwd: cwd})
			if err != nil || dir != tc.want {
				t.Errorf("ResolveDataDir: %q, %v; want %q", dir, err, tc.want)
			}
		})
	}
}

// TestNodeFlagsBadConfig: a tool with NodeFlags stops at a malformed
// config file, naming it.
func TestNodeFlagsBadConfig(t *testing.T) {
	bad := writeFile(t, filepath.Join(t.TempDir(), "config.yaml"), "data-dir: [/srv\n")
	t.Setenv(configFileEnv, bad)
	app := &cli.App{Name: "kelp", Commands: []*cli.Command{{Name: "killall", Flags: NodeFlags(), Action: func(*cli.Context) error { return nil }}}}
	if _, err := WithFileArgs(app, []string{"kelp", "killall"}); err == nil || !strings.Contains(err.Error(), "config file "+bad+" is not valid YAML") {
		t.Errorf("malformed config file: %v", err)
	}
}
