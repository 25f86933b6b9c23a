// Package config turns kelp's command line, KELP_* environment variables and
// config files into validated, immutable settings for each role.
//
// Precedence is flag > environment > config file > default. List flags
// accumulate: values from the files come first, then the environment or the
// command line, so for pass-through arguments the later value wins.
package config
