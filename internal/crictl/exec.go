package crictl

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubectl/pkg/util/term"
)

// execCommand runs a command in a container: streamed through the
// runtime's streaming server like kubectl exec (so -it gives a shell), or
// with -s through one ExecSync call.
func execCommand(ctx context.Context, c *cli.Context, cl clients) error {
	if c.NArg() < 2 {
		return fmt.Errorf("give a CONTAINER-ID and a COMMAND (kelp crictl ps lists the containers)")
	}
	id, cmd := c.Args().First(), c.Args().Tail()
	if c.Bool("sync") {
		return execSync(ctx, c, cl, id, cmd)
	}
	if c.Bool("tty") && !c.Bool("interactive") {
		return fmt.Errorf("-t gives the command a terminal to type into, so it needs -i too: kelp crictl exec -it %s %s", id, strings.Join(cmd, " "))
	}
	tty := term.TTY{In: os.Stdin, Out: c.App.Writer, Raw: c.Bool("tty")}
	if !c.Bool("interactive") {
		tty.In = nil
	}
	if tty.Raw && !tty.IsTerminalIn() {
		return fmt.Errorf("-t needs a terminal on stdin; without one, leave out -t")
	}
	call, cancel := cl.call(ctx)
	defer cancel()
	resp, err := cl.runtime.Exec(call, &runtimeapi.ExecRequest{
		ContainerId: id, Cmd: cmd, Tty: tty.Raw,
		Stdin: tty.In != nil, Stdout: true, Stderr: !tty.Raw,
	})
	if err != nil {
		return lookupError(err, "container", id, "ps")
	}
	streamURL, err := url.Parse(resp.Url)
	if err != nil {
		return fmt.Errorf("the runtime's stream URL %q: %w", resp.Url, err)
	}
	executor, err := remotecommand.NewSPDYExecutor(&restclient.Config{}, "POST", streamURL)
	if err != nil {
		return err
	}
	opts := remotecommand.StreamOptions{Stdin: tty.In, Stdout: c.App.Writer, Tty: tty.Raw}
	if !tty.Raw {
		opts.Stderr = c.App.ErrWriter
	} else {
		opts.TerminalSizeQueue = sizeQueue{tty.MonitorSize(tty.GetSize())}
	}
	return tty.Safe(func() error { return executor.StreamWithContext(ctx, opts) })
}

func execSync(ctx context.Context, c *cli.Context, cl clients, id string, cmd []string) error {
	call, cancel := cl.call(ctx)
	defer cancel()
	resp, err := cl.runtime.ExecSync(call, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: int64(cl.timeout.Seconds())})
	if err != nil {
		return lookupError(err, "container", id, "ps")
	}
	writeAll(c.App.Writer, resp.Stdout)
	writeAll(c.App.ErrWriter, resp.Stderr)
	if resp.ExitCode != 0 {
		return cli.Exit("", int(resp.ExitCode))
	}
	return nil
}

// sizeQueue hands the terminal's sizes to the stream.
type sizeQueue struct{ term.TerminalSizeQueue }

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	size := q.TerminalSizeQueue.Next()
	if size == nil {
		return nil
	}
	return &remotecommand.TerminalSize{Width: size.Width, Height: size.Height}
}

func writeAll(w io.Writer, b []byte) {
	_, _ = w.Write(b)
}
