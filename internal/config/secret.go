package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// secretFlags are the flags whose values are secrets, each with where the
// secret goes instead: every user of the machine reads a command line in
// ps and /proc/<pid>/cmdline.
var secretFlags = map[string]string{
	"token":                  "--token-file or KELP_TOKEN",
	"t":                      "--token-file or KELP_TOKEN",
	"agent-token":            "--agent-token-file or KELP_AGENT_TOKEN",
	"new-token":              "--new-token-file",
	"snapshot-s3-secret-key": "--snapshot-s3-secret-key-file or KELP_SNAPSHOT_S3_SECRET_KEY",
	"datastore-endpoint":     "KELP_DATASTORE_ENDPOINT or the config file",
	"to":                     "--to-file or KELP_MIGRATE_TO", // kelp datastore migrate
}

// tools are the programs kelp carries, whose flags are their own: -t of
// kelp crictl exec is a terminal, not a token.
var tools = []string{"kubectl", "crictl", "ctr", "etcdctl"}

// SecretsOnCommandLine returns a warning for each secret in args, a
// command line, that says where the secret belongs instead. A datastore
// endpoint (--datastore-endpoint, migrate's --to) is a secret when it
// holds a password.
func SecretsOnCommandLine(args []string) []string {
	if len(args) > 1 && slices.Contains(tools, args[1]) {
		return nil
	}
	var warnings []string
	for i := 1; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			break
		}
		if !strings.HasPrefix(arg, "-") {
			continue
		}
		name, value, inline := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		instead, ok := secretFlags[name]
		if !ok {
			continue
		}
		if !inline && i+1 < len(args) {
			value = args[i+1]
		}
		if (name == "datastore-endpoint" || name == "to") && !hasPassword(value) {
			continue
		}
		warnings = append(warnings, fmt.Sprintf("--%s on the command line can be read by every user of this machine (ps, /proc/<pid>/cmdline): use %s", name, instead))
	}
	return warnings
}

// hasPassword says whether a datastore endpoint holds a password: in its
// user info, or as a parameter (MySQL and PostgreSQL take both).
func hasPassword(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil {
		return strings.Contains(endpoint, "@") || strings.Contains(endpoint, "password")
	}
	_, set := u.User.Password()
	return set || strings.Contains(u.RawQuery, "password=")
}
