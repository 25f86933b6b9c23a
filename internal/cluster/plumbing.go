package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/machine"
)

// The hidden commands `kelp cluster machine` and `kelp cluster network`
// are package machine for scripts: the benchmarks (scripts/lib/bench.sh)
// make their nodes with them, in the machines the cluster tests and `kelp
// cluster` make, instead of in a copy of them in shell. A machine or a
// network is made by one command and found again by the next through its
// state file, its JSON as package machine writes it.

// maxStateSize caps what is read of a state file.
const maxStateSize = 1 << 20

// machineCommand is `kelp cluster machine make|remove`.
func machineCommand() *cli.Command {
	return &cli.Command{
		Name:   "machine",
		Hidden: true,
		Usage:  "make and remove machines in namespaces, as kelp cluster makes its nodes (for scripts)",
		Subcommands: []*cli.Command{
			{
				Name: "make",
				Usage: "make a machine: network, mount, cgroup and UTS namespaces held by a process of their own, and cgroups below this command's; " +
					"prints holder=PID, cgroups=DIR… (the machine's subtrees, one per hierarchy) and enter=COMMAND… (shell words, for eval: runs what follows in the machine, as its own pid)",
				ArgsUsage: " ",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "name", Required: true, Usage: "the machine's hostname: lower-case letters, digits and '-'"},
					stateFlag("the file to keep the machine's state in, for remove and network wire (must not exist)"),
					&cli.StringSliceFlag{Name: "network", Usage: "a shell command run in the new network namespace, once loopback is up (repeatable)"},
					&cli.StringSliceFlag{Name: "private", Usage: "DIR (an empty tmpfs) or DIR=HOSTDIR (a bind mount of it) that the machine gets its own copy of (repeatable)"},
					&cli.StringFlag{Name: "cgroup-prefix", Usage: "its cgroups' names, before a random suffix: kelp-KIND-NAME- (default: kelp-machine-NAME-)"},
				},
				Action: func(c *cli.Context) error {
					if err := checkPlumbing(c); err != nil {
						return err
					}
					spec, err := machineSpec(c.String("name"), c.String("cgroup-prefix"), c.StringSlice("network"), c.StringSlice("private"))
					if err != nil {
						return err
					}
					return makeMachine(spec, c.String("state"), c.App.Writer)
				},
			},
			{
				Name:      "remove",
				Usage:     "kill every process of a machine and remove its cgroups and its state file (no state file: nothing to do)",
				ArgsUsage: " ",
				Flags:     []cli.Flag{stateFlag("the machine's state file (machine make --state)")},
				Action: func(c *cli.Context) error {
					if err := checkPlumbing(c); err != nil {
						return err
					}
					return removeMachine(c.String("state"), c.App.ErrWriter)
				},
			},
		},
	}
}

// networkCommand is `kelp cluster network make|wire|remove`.
func networkCommand() *cli.Command {
	return &cli.Command{
		Name:   "network",
		Hidden: true,
		Usage:  "make networks that link machines by a bridge in a network namespace of its own (for scripts)",
		Subcommands: []*cli.Command{
			{
				Name:      "make",
				Usage:     "make a network: a bridge in a new network namespace held by a process of its own; prints holder=PID",
				ArgsUsage: " ",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "bridge", Value: "br0", Usage: "the bridge's name"},
					stateFlag("the file to keep the network's state in, for wire and remove (must not exist)"),
				},
				Action: func(c *cli.Context) error {
					if err := checkPlumbing(c); err != nil {
						return err
					}
					return makeNetwork(c.String("bridge"), c.String("state"), c.App.Writer)
				},
			},
			{
				Name:      "wire",
				Usage:     "link a machine to a network: a veth pair, eth0 in the machine with an address and a default route",
				ArgsUsage: " ",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "network", Required: true, Usage: "the network's state file (network make --state)"},
					&cli.StringFlag{Name: "machine", Required: true, Usage: "the machine's state file (machine make --state)"},
					&cli.StringFlag{Name: "link", Required: true, Usage: "the name of the pair's end on the bridge, unique in the network"},
					&cli.StringFlag{Name: "address", Required: true, Usage: "eth0's address and prefix length, such as 10.99.0.3/24"},
					&cli.StringFlag{Name: "gateway", Required: true, Usage: "the machine's default gateway, in the address's network"},
				},
				Action: func(c *cli.Context) error {
					if err := checkPlumbing(c); err != nil {
						return err
					}
					w, err := parseWire(c.String("link"), c.String("address"), c.String("gateway"))
					if err != nil {
						return err
					}
					return wireMachine(c.String("network"), c.String("machine"), w)
				},
			},
			{
				Name:      "remove",
				Usage:     "remove a network, its bridge and every pair wired to it, and its state file (no state file: nothing to do)",
				ArgsUsage: " ",
				Flags:     []cli.Flag{stateFlag("the network's state file (network make --state)")},
				Action: func(c *cli.Context) error {
					if err := checkPlumbing(c); err != nil {
						return err
					}
					return removeNetwork(c.String("state"), c.App.ErrWriter)
				},
			},
		},
	}
}

func stateFlag(usage string) cli.Flag {
	return &cli.StringFlag{Name: "state", Required: true, Usage: usage}
}

// checkPlumbing refuses positional arguments, which these commands take none of,
// and checks the host can make machines.
func checkPlumbing(c *cli.Context) error {
	if c.NArg() > 0 {
		var names []string
		for _, l := range c.Lineage() {
			if l.Command != nil && l.Command.Name != "" {
				names = append([]string{l.Command.Name}, names...)
			}
		}
		return fmt.Errorf("%s takes flags only, not %q", strings.Join(names, " "), c.Args().Slice())
	}
	return CheckHost("/proc")
}

// hostnameRE: a machine's name is its hostname, and goes unquoted into
// the shell script that sets it.
var hostnameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// safePathRE: the paths a machine mounts over go unquoted into the shell
// script that mounts them.
var safePathRE = regexp.MustCompile(`^/[A-Za-z0-9._/@+-]*$`)

// cgroupPrefixRE is the pattern of the cgroup prefix of the machine name:
// kelp-KIND-NAME-. Remove accepts only cgroups named so (machineCgroup),
// so that a state file cannot name another machine's, or the host's.
func cgroupPrefixRE(name, suffix string) *regexp.Regexp {
	return regexp.MustCompile("^kelp-[a-z0-9]+-" + regexp.QuoteMeta(name) + "-" + suffix + "$")
}

// machineCgroup says whether base is the name of a cgroup of the machine
// name: its prefix and newCgroupTree's random digits.
func machineCgroup(name string) func(base string) bool {
	return cgroupPrefixRE(name, "[0-9]+").MatchString
}

// machineSpec is the machine that `machine make` is asked for, its cgroups
// not yet placed.
func machineSpec(name, cgroupPrefix string, network, private []string) (machine.Spec, error) {
	if !hostnameRE.MatchString(name) {
		return machine.Spec{}, fmt.Errorf("machine name %q is no hostname: use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit", name)
	}
	if cgroupPrefix == "" {
		cgroupPrefix = "kelp-machine-" + name + "-"
	}
	if !cgroupPrefixRE(name, "").MatchString(cgroupPrefix) {
		return machine.Spec{}, fmt.Errorf("--cgroup-prefix %q: give kelp-KIND-%s-, KIND of lower-case letters and digits (such as kelp-bench-%s-)", cgroupPrefix, name, name)
	}
	for _, cmd := range network {
		if strings.TrimSpace(cmd) == "" {
			return machine.Spec{}, errors.New("--network is empty: give a shell command, such as \"ip link add br0 type bridge\"")
		}
	}
	dirs, err := parsePrivate(private)
	if err != nil {
		return machine.Spec{}, err
	}
	return machine.Spec{Name: name, Network: network, Private: dirs, CgroupName: cgroupPrefix, RandomCgroup: true}, nil
}

// parsePrivate reads --private DIR and DIR=HOSTDIR into machine.Spec's
// Private.
func parsePrivate(flags []string) (map[string]string, error) {
	dirs := map[string]string{}
	for _, f := range flags {
		dir, host, bind := strings.Cut(f, "=")
		if !safePathRE.MatchString(dir) || filepath.Clean(dir) != dir || dir == "/" {
			return nil, fmt.Errorf("--private %q: give an absolute, clean path other than / of letters, digits and ._@+-/, optionally =HOSTDIR", f)
		}
		if bind && (!filepath.IsAbs(host) || filepath.Clean(host) != host) {
			return nil, fmt.Errorf("--private %q: HOSTDIR must be an absolute, clean path", f)
		}
		if _, dup := dirs[dir]; dup {
			return nil, fmt.Errorf("--private %s is given twice", dir)
		}
		dirs[dir] = host
	}
	return dirs, nil
}

// makeMachine makes the machine spec below this process's cgroups, as the
// cluster tests place theirs, keeps it in state and says how to find and
// enter it on w.
func makeMachine(spec machine.Spec, state string, w io.Writer) error {
	if err := checkNewState(state); err != nil {
		return err
	}
	var err error
	if spec.Cgroups, err = machine.BelowCaller(); err != nil {
		return err
	}
	m, err := machine.Make(spec, machine.Detached)
	if err != nil {
		return err
	}
	if err := writeNewState(state, m); err != nil {
		return errors.Join(err, m.Remove())
	}
	_, err = io.WriteString(w, machineLines(m))
	return err
}

// machineLines are what `machine make` prints of m, as NAME=VALUE lines a
// shell reads without jq: the holder's pid, the roots of its cgroup
// subtrees, and the command that enters it, as shell words, without the
// command to run there.
func machineLines(m *machine.Machine) string {
	var dirs []string
	for _, h := range m.Cgroups.Hierarchies {
		dirs = append(dirs, h.Dir)
	}
	enter := m.Command("").Args
	return fmt.Sprintf("holder=%d\ncgroups=%s\nenter=%s\n", m.Holder.Pid, strings.Join(dirs, " "), shellWords(enter[:len(enter)-1]))
}

// shellWords quotes words for a POSIX shell, each word where it needs it.
func shellWords(words []string) string {
	quoted := make([]string, len(words))
	for i, w := range words {
		if w != "" && strings.Trim(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./,:=@%+-") == "" {
			quoted[i] = w
		} else {
			quoted[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
	}
	return strings.Join(quoted, " ")
}

// removeMachine removes the machine of state, and state. A state file
// that is gone is a machine removed before: a note on w, no error.
func removeMachine(state string, w io.Writer) error {
	var m machine.Machine
	if err := readState(state, &m); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(w, "no machine to remove: %s does not exist\n", state)
		return nil
	} else if err != nil {
		return err
	}
	if err := checkMachine(&m); err != nil {
		return fmt.Errorf("%s is no state of a machine kelp made here (%w): nothing removed", state, err)
	}
	if err := m.Remove(); err != nil {
		return fmt.Errorf("remove machine %s: %w (kelp cluster machine remove --state %s tries again)", m.Name, err, state)
	}
	return removeState(state)
}

// checkMachine says why m, read from a state file, is not a machine that
// makeMachine made and run from here: Remove kills its holder and every
// process in its cgroups, so a file edited, mixed up or forged must name
// cgroups kelp named for m (machineCgroup) where makeMachine placed them,
// and a holder of m's own (machine.Machine.Verify).
func checkMachine(m *machine.Machine) error {
	if !hostnameRE.MatchString(m.Name) {
		return fmt.Errorf("machine name %q is not one kelp gives", m.Name)
	}
	p, err := machine.BelowCaller()
	if err != nil {
		return err
	}
	return m.Verify(p, machineCgroup(m.Name))
}

// linkRE: a network interface's name, which goes unquoted into the shell
// commands that make a network.
var linkRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)

func checkLink(flag, name string) error {
	if !linkRE.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("%s %q: an interface name has 1 to 15 letters, digits, '.', '_' or '-'", flag, name)
	}
	return nil
}

// makeNetwork makes a network whose bridge is named bridge, keeps it in
// state and prints its holder's pid on w.
func makeNetwork(bridge, state string, w io.Writer) error {
	if err := checkLink("--bridge", bridge); err != nil {
		return err
	}
	if err := checkNewState(state); err != nil {
		return err
	}
	n, err := machine.NewNetwork(bridge, nil, machine.Detached)
	if err != nil {
		return err
	}
	if err := writeNewState(state, n); err != nil {
		return errors.Join(err, n.Remove())
	}
	_, err = fmt.Fprintf(w, "holder=%d\n", n.Holder.Pid)
	return err
}

// wire is what `network wire` is asked for.
type wire struct {
	link    string
	address netip.Prefix
	gateway netip.Addr
}

// parseWire reads the flags of `network wire`: the address is a host's of
// its network, and the gateway another in the same.
func parseWire(link, address, gateway string) (wire, error) {
	if err := checkLink("--link", link); err != nil {
		return wire{}, err
	}
	addr, err := netip.ParsePrefix(address)
	if err != nil {
		return wire{}, fmt.Errorf("--address %q: give an address with its prefix length, such as 10.99.0.3/24", address)
	}
	if addr.Bits() < addr.Addr().BitLen()-1 && addr.Addr() == addr.Masked().Addr() {
		return wire{}, fmt.Errorf("--address %s is its network's own address: give a host's, such as %s", addr, addr.Addr().Next())
	}
	gw, err := netip.ParseAddr(gateway)
	if err != nil || !addr.Contains(gw) || gw == addr.Addr() {
		return wire{}, fmt.Errorf("--gateway %q: give another address of %s than the machine's", gateway, addr.Masked())
	}
	return wire{link: link, address: addr, gateway: gw}, nil
}

// wireMachine links the machine of machineState to the network of
// networkState.
func wireMachine(networkState, machineState string, w wire) error {
	var n machine.Network
	if err := readState(networkState, &n); err != nil {
		return err
	}
	var m machine.Machine
	if err := readState(machineState, &m); err != nil {
		return err
	}
	if !n.Alive() {
		return fmt.Errorf("the network of %s no longer runs (its holder %d is gone): remove it and make it again", networkState, n.Holder.Pid)
	}
	if !m.Alive() {
		return fmt.Errorf("the machine of %s no longer runs (its holder %d is gone): remove it and make it again", machineState, m.Holder.Pid)
	}
	if err := checkNetwork(&n); err != nil {
		return fmt.Errorf("%s is no state of a network kelp made: %w", networkState, err)
	}
	if err := checkMachine(&m); err != nil {
		return fmt.Errorf("%s is no state of a machine kelp made here: %w", machineState, err)
	}
	return n.Wire(&m, w.link, w.address, w.gateway)
}

// removeNetwork removes the network of state, and state; no state file is
// a note on w, as for removeMachine.
func removeNetwork(state string, w io.Writer) error {
	var n machine.Network
	if err := readState(state, &n); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(w, "no network to remove: %s does not exist\n", state)
		return nil
	} else if err != nil {
		return err
	}
	if err := checkNetwork(&n); err != nil {
		return fmt.Errorf("%s is no state of a network kelp made (%w): nothing removed", state, err)
	}
	if err := n.Remove(); err != nil {
		return err
	}
	return removeState(state)
}

// checkNetwork says why n, read from a state file, is not a network that
// makeNetwork made: Remove kills its holder.
func checkNetwork(n *machine.Network) error {
	if err := checkLink("bridge", n.Bridge); err != nil {
		return err
	}
	return n.Verify()
}

// checkNewState says why state cannot take a new machine's or network's
// state, before either is made.
func checkNewState(state string) error {
	if _, err := os.Lstat(state); err == nil {
		return fmt.Errorf("%s exists: it may hold a machine or network still running (remove it with its remove command, or give another file)", state)
	}
	if info, err := os.Stat(filepath.Dir(state)); err != nil || !info.IsDir() {
		return fmt.Errorf("%s: its directory must exist", state)
	}
	return nil
}

// writeNewState writes v as JSON to state, durably and only if state does
// not exist yet: two commands given one file must not both think it
// holds theirs.
func writeNewState(state string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := atomicfile.Temp(filepath.Dir(state), "."+filepath.Base(state)+".tmp-", 0o600, func(f *os.File) error {
		_, err := f.Write(append(data, '\n'))
		return err
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", state, err)
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, state); err != nil {
		return fmt.Errorf("write %s: %w", state, err)
	}
	return atomicfile.SyncDir(filepath.Dir(state))
}

// readState reads the JSON of state into v. What state names is removed
// as root, so it must be as writeNewState leaves it: this user's, and
// written by no other (its directory too, unless sticky).
func readState(state string, v any) error {
	data, err := atomicfile.ReadRegular(state, maxStateSize)
	if err != nil {
		return err
	}
	if err := checkStateOwner(state); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("read %s: %w (is it a state file of kelp cluster machine or network make?)", state, err)
	}
	return nil
}

// checkStateOwner says why another user than this one could have written
// state: its owner, its mode, or its directory's.
func checkStateOwner(state string) error {
	for _, path := range []string{state, filepath.Dir(state)} {
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner", path)
		}
		if int(st.Uid) != os.Geteuid() {
			return fmt.Errorf("%s belongs to uid %d, not to this user (uid %d): a state file is taken only from where no other user could have written it", path, st.Uid, os.Geteuid())
		}
		sticky := path != state && info.Mode()&fs.ModeSticky != 0
		if info.Mode().Perm()&0o022 != 0 && !sticky {
			return fmt.Errorf("%s is writable by other users (mode %s): a state file is taken only from where no other user could have written it", path, info.Mode().Perm())
		}
	}
	return nil
}

// removeState removes a state file once what it named is gone.
func removeState(state string) error {
	if err := os.Remove(state); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(state))
}
