// Package kubectl runs the upstream kubectl built into kelp.
package kubectl

import (
	"os"
	"strings"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // client auth plugins, as upstream kubectl has
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/plugin"
	"k8s.io/kubectl/pkg/cmd/util"

	"github.com/kelp-dev/kelp/internal/layout"
)

// Run runs kubectl with args (without the program name). On failure it
// prints the error and exits with kubectl's exit code, as upstream kubectl
// does through util.CheckErr; scripts depend on those codes.
func Run(args []string) {
	args = withDefaultKubeconfig(args, os.Getenv("KUBECONFIG"))
	_, _ = logs.GlogSetter(cmd.GetLogVerbosity(args))
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	command := cmd.NewDefaultKubectlCommandWithArgs(cmd.KubectlOptions{
		PluginHandler: cmd.NewDefaultPluginHandler(plugin.ValidPluginFilenamePrefixes),
		Arguments:     append([]string{"kubectl"}, args...),
		ConfigFlags:   configFlags(streams),
		IOStreams:     streams,
	})
	command.SetArgs(args)
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}

// withDefaultKubeconfig points kubectl at kelp's admin kubeconfig unless
// the user chose one, so `kelp kubectl` works right after `kelp server`.
func withDefaultKubeconfig(args []string, envKubeconfig string) []string {
	if envKubeconfig != "" {
		return args
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--kubeconfig" || strings.HasPrefix(a, "--kubeconfig=") {
			return args
		}
	}
	if _, err := os.Stat(layout.Kubeconfig); err != nil {
		return args
	}
	return append([]string{"--kubeconfig=" + layout.Kubeconfig}, args...)
}

func configFlags(streams genericiooptions.IOStreams) *genericclioptions.ConfigFlags {
	return genericclioptions.NewConfigFlags(true).WithDeprecatedPasswordFlag().
		WithDiscoveryBurst(300).WithDiscoveryQPS(50.0).WithWarningPrinter(streams)
}
