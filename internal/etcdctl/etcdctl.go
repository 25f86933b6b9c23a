// Package etcdctl is upstream etcdctl, preset to reach the datastore of the
// kelp server on this host, so that runbooks written for etcd work as they
// are: embedded etcd with the apiserver's client certificate, or kine's
// unix socket in front of SQLite (or PostgreSQL and MySQL).
package etcdctl

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/etcdctl/v3/ctlv3/command"
	"go.etcd.io/etcd/etcdutl/v3/etcdutl"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
)

// Main runs etcdctl with args; args[0] is the program name. A leading
// --data-dir DIR says whose datastore to reach; without it KELP_DATA_DIR,
// then kelp's config file, then /var/lib/kelp. etcdctl's own flags and its
// ETCDCTL_* variables override the endpoint and TLS files found there.
// Most etcdctl commands exit the process themselves when they fail.
func Main(args []string) error {
	dataDir, rest, err := config.ToolDataDir(args[1:])
	if err != nil {
		return err
	}
	be, err := datastore.LocalBackend(dataDir)
	if err != nil && !userEndpoints(rest, os.Getenv) {
		// Not fatal: help, version and snapshot status need no datastore.
		fmt.Fprintf(os.Stderr, "etcdctl: %v; give --data-dir DIR before the etcdctl arguments for another kelp server, or --endpoints for an external datastore\n", err)
	}
	root := newRoot(be)
	root.SetArgs(rest)
	return root.Execute()
}

// userEndpoints reports whether the user names the datastore himself.
func userEndpoints(args []string, getenv func(string) string) bool {
	if getenv("ETCDCTL_ENDPOINTS") != "" || getenv("ETCDCTL_DISCOVERY_SRV") != "" {
		return true
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		for _, flag := range []string{"--endpoints", "--discovery-srv", "-d"} {
			if a == flag || strings.HasPrefix(a, flag+"=") {
				return true
			}
		}
	}
	return false
}

// newRoot is etcdctl's root command as ctlv3 builds it, with the endpoint
// and TLS files of be as the defaults of its flags. ctlv3 itself offers only
// a Start that reads os.Args, and its init turns on cobra's prefix matching
// for every command in the binary, kubectl's too; so kelp builds the root
// from the exported commands instead. Keep it in step with ctlv3/ctl.go when
// etcd is upgraded.
func newRoot(be datastore.Backend) *cobra.Command {
	endpoints := []string{"127.0.0.1:2379"}
	if len(be.Endpoints) > 0 {
		endpoints = be.Endpoints
	}
	var g command.GlobalFlags
	root := &cobra.Command{
		Use:   "etcdctl",
		Short: "A simple command line client for etcd3, preset for this kelp server's datastore.",
		// kelp's main prints the error once.
		SilenceErrors: true,
	}
	f := root.PersistentFlags()
	f.StringSliceVar(&g.Endpoints, "endpoints", endpoints, "gRPC endpoints")
	f.BoolVar(&g.Debug, "debug", false, "enable client-side debug logging")
	f.StringVarP(&g.OutputFormat, "write-out", "w", "simple", "set the output format (fields, json, protobuf, simple, table)")
	f.BoolVar(&g.IsHex, "hex", false, "print byte strings as hex encoded strings")
	root.RegisterFlagCompletionFunc("write-out", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"fields", "json", "protobuf", "simple", "table"}, cobra.ShellCompDirectiveDefault
	})
	f.DurationVar(&g.DialTimeout, "dial-timeout", 2*time.Second, "dial timeout for client connections")
	f.DurationVar(&g.CommandTimeOut, "command-timeout", 5*time.Second, "timeout for short running command (excluding dial timeout)")
	f.DurationVar(&g.KeepAliveTime, "keepalive-time", 2*time.Second, "keepalive time for client connections")
	f.DurationVar(&g.KeepAliveTimeout, "keepalive-timeout", 6*time.Second, "keepalive timeout for client connections")
	f.IntVar(&g.MaxCallSendMsgSize, "max-request-bytes", 0, "client-side request send limit in bytes (if 0, it defaults to 2.0 MiB (2 * 1024 * 1024).)")
	f.IntVar(&g.MaxCallRecvMsgSize, "max-recv-bytes", 0, "client-side response receive limit in bytes (if 0, it defaults to \"math.MaxInt32\")")
	f.BoolVar(&g.Insecure, "insecure-transport", true, "disable transport security for client connections")
	f.BoolVar(&g.InsecureDiscovery, "insecure-discovery", true, "accept insecure SRV records describing cluster endpoints")
	f.BoolVar(&g.InsecureSkipVerify, "insecure-skip-tls-verify", false, "skip server certificate verification (CAUTION: this option should be enabled only for testing purposes)")
	f.StringVar(&g.TLS.CertFile, "cert", be.CertFile, "identify secure client using this TLS certificate file")
	f.StringVar(&g.TLS.KeyFile, "key", be.KeyFile, "identify secure client using this TLS key file")
	f.StringVar(&g.TLS.TrustedCAFile, "cacert", be.CAFile, "verify certificates of TLS-enabled secure servers using this CA bundle")
	f.StringVar(&g.Token, "auth-jwt-token", "", "JWT token used for authentication (if this option is used, --user and --password should not be set)")
	f.StringVar(&g.User, "user", "", "username[:password] for authentication (prompt if password is not supplied)")
	f.StringVar(&g.Password, "password", "", "password for authentication (if this option is used, --user option shouldn't include password)")
	f.StringVarP(&g.TLS.ServerName, "discovery-srv", "d", "", "domain name to query for SRV records describing cluster endpoints")
	f.StringVarP(&g.DNSClusterServiceName, "discovery-srv-name", "", "", "service name to query when using DNS discovery")

	root.AddGroup(
		command.NewKVGroup(),
		command.NewClusterMaintenanceGroup(),
		command.NewConcurrencyGroup(),
		command.NewAuthenticationGroup(),
		command.NewUtilityGroup(),
	)
	snapshot := command.NewSnapshotCommand()
	addSnapshotStatus(snapshot)
	root.AddCommand(
		command.NewGetCommand(),
		command.NewPutCommand(),
		command.NewDelCommand(),
		command.NewTxnCommand(),
		command.NewCompactionCommand(),
		command.NewAlarmCommand(),
		command.NewDefragCommand(),
		command.NewEndpointCommand(),
		command.NewMoveLeaderCommand(),
		command.NewWatchCommand(),
		command.NewVersionCommand(),
		command.NewLeaseCommand(),
		command.NewMemberCommand(),
		snapshot,
		command.NewMakeMirrorCommand(),
		command.NewLockCommand(),
		command.NewElectCommand(),
		command.NewAuthCommand(),
		command.NewUserCommand(),
		command.NewRoleCommand(),
		command.NewCheckCommand(),
		command.NewCompletionCommand(),
		command.NewDowngradeCommand(),
		command.NewOptionsCommand(root),
	)
	command.SetHelpCmdGroup(root)

	f.VisitAll(func(flag *pflag.Flag) { f.MarkHidden(flag.Name) })
	if root.Flags().Lookup("help") == nil {
		root.Flags().BoolP("help", "h", false, "help for "+root.Name())
	}
	root.Flags().MarkHidden("help")
	help := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		help(cmd, args)
		fmt.Fprintln(cmd.OutOrStdout(), `Use "etcdctl options" for a list of global command-line options (applies to all commands).`)
	})
	return root
}

// addSnapshotStatus adds etcdutl's `snapshot status FILE` to etcdctl's
// snapshot command. It moved to etcdutl in etcd 3.6, but runbooks still
// call it through etcdctl, and it only reads a file.
func addSnapshotStatus(snapshot *cobra.Command) {
	utl := etcdutl.NewSnapshotCommand()
	for _, c := range utl.Commands() {
		if c.Name() == "status" {
			utl.RemoveCommand(c)
			snapshot.AddCommand(c)
		}
	}
}
