package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeMirrorDir != "" {
		os.RemoveAll(fakeMirrorDir)
	}
	os.Exit(code)
}

var links = []string{"kubectl", "crictl", "ctr", "etcdctl"}

// hostHas says whether the sandbox's PATH, outside busybox runs, finds
// cmd: install.sh then makes no link of that name.
func hostHas(cmd string) bool {
	for _, dir := range []string{"/usr/local/sbin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		if fi, err := os.Stat(filepath.Join(dir, cmd)); err == nil && fi.Mode()&0o111 != 0 {
			return true
		}
	}
	return false
}

// calls drops the fake kelp's --version calls, which say nothing about
// what was done, and the syncs, which syncs lists.
func calls(s *sandbox) []string {
	var out []string
	for _, c := range s.callLog() {
		if c != "" && !strings.HasSuffix(c, " --version") && !isSync(c) {
			out = append(out, c)
		}
	}
	return out
}

func isSync(call string) bool {
	return strings.HasPrefix(call, "sync ") || strings.HasPrefix(call, "  installed: ")
}

// syncs lists the script's syncs, each as "sync ARGS (installed: VERSION)".
func syncs(s *sandbox) []string {
	var out []string
	for _, c := range s.callLog() {
		switch {
		case strings.HasPrefix(c, "sync "):
			out = append(out, c)
		case strings.HasPrefix(c, "  installed: ") && len(out) > 0:
			out[len(out)-1] += " (" + strings.TrimSpace(c) + ")"
		}
	}
	return out
}

// wantSynced fails unless one of the script's syncs matches pattern.
func wantSynced(t *testing.T, s *sandbox, pattern string) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	got := syncs(s)
	if !slices.ContainsFunc(got, re.MatchString) {
		t.Errorf("no sync matches %q; syncs:\n  %s", pattern, strings.Join(got, "\n  "))
	}
}

func wantCalls(t *testing.T, s *sandbox, want ...string) {
	t.Helper()
	if got := calls(s); !reflect.DeepEqual(got, want) {
		t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	s.resetCalls()
}

func wantWritten(t *testing.T, s *sandbox, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := s.written(); !slices.Equal(got, want) {
		t.Errorf("in the fake root:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestSystemd installs a server as a systemd service with each shell,
// upgrades it in place, and uninstalls it.
func TestSystemd(t *testing.T) {
	for _, shell := range []string{dash, bash, busybox} {
		t.Run(shell, func(t *testing.T) { testSystemd(t, shell) })
	}
}

func testSystemd(t *testing.T, shell string) {
	s := newSandbox(t, systemd, fakeMirror(t))
	out := s.mustInstall(run{
		shell: shell,
		args: []string{"server", "--cluster-init", "--token", "s3cret", "--datastore-endpoint=postgres://u:pw@db/kelp",
			"--node-label", "a=b c", "--tls-san", `100%$x\y'z`},
		env: []string{"KELP_NODE_NAME=pi-1", "KELP_AGENT_TOKEN=it's secret", "HTTPS_PROXY=http://proxy:3128"},
	})
	if shell == busybox && !strings.Contains(out, "from "+s.url) {
		t.Errorf("busybox run did not download from the mirror")
	}

	kelp := "/usr/local/bin/kelp"
	if got := s.read(kelp); got != string(fakeKelp("v1.0.0")) {
		t.Errorf("%s is not v1.0.0:\n%s", kelp, got)
	}
	if m := s.mode(kelp); m != 0o755 {
		t.Errorf("%s mode %v, want 0755", kelp, m)
	}
	var madeLinks []string
	for _, l := range links {
		path := "/usr/local/bin/" + l
		if shell != busybox && hostHas(l) {
			if s.exists(path) {
				t.Errorf("%s made, though %s exists on PATH", path, l)
			}
			continue
		}
		madeLinks = append(madeLinks, path)
		if target, err := os.Readlink(s.hostPath(path)); err != nil || target != kelp {
			t.Errorf("%s -> %q (%v), want a link to %s", path, target, err, kelp)
		}
	}
	unit := s.read("/etc/systemd/system/kelp.service")
	for _, line := range []string{
		"Type=notify", "KillMode=process", "Delegate=yes", "LimitNOFILE=1048576", "LimitNPROC=infinity",
		"LimitCORE=infinity", "TasksMax=infinity", "TimeoutStartSec=0", "Restart=always", "RestartSec=5s",
		"EnvironmentFile=-/etc/systemd/system/kelp.service.env", "After=network-online.target",
		"Wants=network-online.target", "WantedBy=multi-user.target",
	} {
		if !slices.Contains(strings.Split(unit, "\n"), line) {
			t.Errorf("unit has no line %q", line)
		}
	}
	for _, secret := range []string{"s3cret", "pw@db", "it's secret", "proxy"} {
		if strings.Contains(unit, secret) {
			t.Errorf("unit file holds %q:\n%s", secret, unit)
		}
	}
	argv, err := sdSplit(unitValue(unit, "ExecStart"))
	if err != nil {
		t.Fatal(err)
	}
	wantArgv := []string{kelp, "server", "--cluster-init", "--node-label", "a=b c", "--tls-san", `100%$x\y'z`}
	if !slices.Equal(argv, wantArgv) {
		t.Errorf("ExecStart runs %q, want %q", argv, wantArgv)
	}
	if m := s.mode("/etc/systemd/system/kelp.service"); m != 0o644 {
		t.Errorf("unit mode %v, want 0644", m)
	}
	envFile := "/etc/systemd/system/kelp.service.env"
	if m := s.mode(envFile); m != 0o600 {
		t.Errorf("env file mode %v, want 0600", m)
	}
	got := s.sh(`set -a; . ` + envFile + `; printf '%s|' "$KELP_TOKEN" "$KELP_DATASTORE_ENDPOINT" "$KELP_AGENT_TOKEN" "$KELP_NODE_NAME" "$HTTPS_PROXY"`)
	if want := "s3cret|postgres://u:pw@db/kelp|it's secret|pi-1|http://proxy:3128|"; got != want {
		t.Errorf("env file gives %q, want %q:\n%s", got, want, s.read(envFile))
	}
	verifyUnit(t, s, "/etc/systemd/system/kelp.service")
	// A power cut after the install keeps the unit whole: on disk before
	// its rename, the rename after it.
	wantSynced(t, s, `^sync /etc/systemd/system/kelp\.service\.kelp-install\.[0-9]+ `)
	wantSynced(t, s, `^sync /etc/systemd/system `)
	wantCalls(t, s, "kelp check-config", "systemctl daemon-reload", "systemctl enable kelp", "systemctl restart kelp")
	s.sh("/usr/local/bin/crictl ps") // kelp is multicall: a link runs it as crictl
	wantCalls(t, s, "crictl ps")
	installed := append([]string{kelp, "/usr/local/bin/kelp-uninstall.sh", "/usr/local/bin/kelp-killall.sh",
		"/etc/systemd/system/kelp.service", envFile}, madeLinks...)
	wantWritten(t, s, installed...)
	for _, f := range []string{"/usr/local/bin/kelp-uninstall.sh", "/usr/local/bin/kelp-killall.sh"} {
		if m := s.mode(f); m != 0o755 {
			t.Errorf("%s mode %v, want 0755", f, m)
		}
		if out, err := exec.Command("shellcheck", s.hostPath(f)).CombinedOutput(); err != nil {
			t.Errorf("shellcheck %s: %v\n%s", f, err, out)
		}
	}

	// Upgrade: no arguments and no KELP_* settings keep the service as it
	// is; only the binary changes.
	env := s.read(envFile)
	s.mustInstall(run{shell: shell, env: []string{"INSTALL_KELP_VERSION=v2.0.0"}})
	if got := s.read(kelp); got != string(fakeKelp("v2.0.0")) {
		t.Errorf("after the upgrade %s is not v2.0.0:\n%s", kelp, got)
	}
	if got := s.read(kelp + ".previous"); got != string(fakeKelp("v1.0.0")) {
		t.Errorf("kelp.previous is not v1.0.0:\n%s", got)
	}
	if s.read("/etc/systemd/system/kelp.service") != unit || s.read(envFile) != env {
		t.Error("the upgrade changed the unit or its env file")
	}
	// After a power cut kelp is the old binary or the whole new one: the
	// new one is on disk while the old is still in place, and the rename
	// is made durable after it.
	wantSynced(t, s, `^sync /usr/local/bin/\.kelp-install\.[^/]+/kelp \(installed: kelp v1\.0\.0\)$`)
	wantSynced(t, s, `^sync /usr/local/bin \(installed: kelp v2\.0\.0\)$`)
	wantCalls(t, s, "kelp check-config", "systemctl daemon-reload", "systemctl enable kelp", "systemctl restart kelp")
	out = s.mustInstall(run{shell: shell, env: []string{"INSTALL_KELP_VERSION=v2.0.0"}})
	if !strings.Contains(out, "already this kelp") || s.read(kelp+".previous") != string(fakeKelp("v1.0.0")) {
		t.Error("installing the same version again replaced the binary")
	}
	wantWritten(t, s, append(installed, kelp+".previous")...)
	s.resetCalls()

	if _, err := s.uninstall("/usr/local/bin/kelp-uninstall.sh"); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	wantCalls(t, s, "systemctl stop kelp", "kelp killall --data-dir /var/lib/kelp", "systemctl disable kelp",
		"systemctl reset-failed kelp", "systemctl daemon-reload")
	if left := s.leftovers(); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}
}

// verifyUnit runs systemd-analyze verify on a unit in the sandbox, where
// its ExecStart binary exists. It needs no running systemd.
func verifyUnit(t *testing.T, s *sandbox, unit string) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not installed: unit not verified (apt-get install systemd)")
		return
	}
	out, err := s.n.Run(time.Minute, s.n.Command("systemd-analyze", "verify", unit))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
	}
}

// TestOpenRC installs an agent (KELP_URL and KELP_TOKEN imply one) as an
// OpenRC service and checks what its init script gives openrc-run.
func TestOpenRC(t *testing.T) {
	s := newSandbox(t, openrc, fakeMirror(t))
	s.mustInstall(run{
		env:  []string{"KELP_URL=https://10.0.0.1:6443", "KELP_TOKEN=K10abc::server:xyz"},
		args: []string{"--node-label", "zone=it's here"},
	})
	script := "/etc/init.d/kelp-agent"
	if m := s.mode(script); m != 0o755 {
		t.Errorf("%s mode %v, want 0755", script, m)
	}
	text := s.read(script)
	if first := strings.SplitN(text, "\n", 2)[0]; first != "#!"+s.stubs+"/openrc-run" {
		t.Errorf("%s starts with %q, want openrc-run's path", script, first)
	}
	if strings.Contains(text, "K10abc") {
		t.Errorf("init script holds the token:\n%s", text)
	}
	envFile := "/etc/kelp/kelp-agent.env"
	if m := s.mode(envFile); m != 0o600 {
		t.Errorf("env file mode %v, want 0600", m)
	}
	// What openrc-run sees: the script's variables (command_args is
	// eval'ed by openrc-run) and the env file's settings.
	got := s.sh(`depend() { :; }; . ` + script + `
printf '%s\n' "$supervisor" "$command" "$output_log" "$error_log" "$respawn_delay" "$KELP_URL" "$KELP_TOKEN"
eval "set -- $command_args"; printf 'arg %s\n' "$@"
command -v depend >/dev/null && command -v start_pre >/dev/null && echo functions`)
	want := strings.Join([]string{"supervise-daemon", "/usr/local/bin/kelp", "/var/log/kelp-agent.log", "/var/log/kelp-agent.log", "5",
		"https://10.0.0.1:6443", "K10abc::server:xyz", "arg agent", "arg --node-label", "arg zone=it's here", "functions"}, "\n") + "\n"
	if got != want {
		t.Errorf("init script gives\n%s\nwant\n%s", got, want)
	}
	// Soft dependencies only: a need of a service the distribution lacks
	// (Debian's OpenRC has no localmount) keeps kelp from starting.
	deps := s.sh(`need() { echo need "$@"; }; use() { echo use "$@"; }; want() { echo want "$@"; }
after() { echo after "$@"; }; before() { echo before "$@"; }
. ` + script + `
depend`)
	if want := "want cgroups\nafter localmount net-online\n"; deps != want {
		t.Errorf("depend() declares\n%swant\n%s", deps, want)
	}
	if out, err := exec.Command("sh", "-n", s.hostPath(script)).CombinedOutput(); err != nil {
		t.Errorf("sh -n %s: %v\n%s", script, err, out)
	}
	wantCalls(t, s, "kelp check-config", "rc-update add kelp-agent default", "rc-service kelp-agent restart")
	if s.exists("/usr/local/bin/kelp-uninstall.sh") {
		t.Error("an agent install wrote kelp-uninstall.sh; its uninstaller is kelp-agent-uninstall.sh")
	}
	if _, err := s.uninstall("/usr/local/bin/kelp-agent-uninstall.sh"); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	wantCalls(t, s, "rc-service kelp-agent stop", "kelp killall --data-dir /var/lib/kelp", "rc-update delete kelp-agent default")
	if left := s.leftovers(); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}
}

// TestNoServiceManager installs where there is neither systemd nor
// OpenRC: the binary and the scripts, and how to start kelp by hand.
func TestNoServiceManager(t *testing.T) {
	s := newSandbox(t, none, fakeMirror(t))
	out := s.mustInstall(run{args: []string{"server", "--token", "abc"}})
	if !strings.Contains(out, "start kelp by hand") || !strings.Contains(out, "/usr/local/bin/kelp server") {
		t.Errorf("no word on how to start kelp:\n%s", out)
	}
	if m := s.mode("/etc/kelp/kelp.env"); m != 0o600 {
		t.Errorf("env file mode %v, want 0600", m)
	}
	wantCalls(t, s, "kelp check-config")
	if _, err := s.uninstall("/usr/local/bin/kelp-uninstall.sh"); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	wantCalls(t, s, "kelp killall --data-dir /var/lib/kelp")
	if left := s.leftovers(); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}
}

// TestOptions covers the INSTALL_KELP_* settings that change what is
// installed or started.
func TestOptions(t *testing.T) {
	mirror := fakeMirror(t)
	kelp := "/usr/local/bin/kelp"
	t.Run("skip start", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.mustInstall(run{env: []string{"INSTALL_KELP_SKIP_START=true"}})
		wantCalls(t, s, "kelp check-config", "systemctl daemon-reload", "systemctl enable kelp")
	})
	t.Run("skip enable", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.mustInstall(run{env: []string{"INSTALL_KELP_SKIP_ENABLE=true"}})
		wantCalls(t, s, "kelp check-config", "systemctl daemon-reload")
	})
	t.Run("arm64", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.stub("uname", `[ "$1" = -m ] && echo aarch64 && exit 0; exec /bin/uname "$@"`)
		s.mustInstall(run{})
		if got := s.read(kelp); got != string(fakeKelp("v1.0.0-arm64")) {
			t.Errorf("installed %q, want the arm64 release", got)
		}
	})
	t.Run("channel with curl", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.mustInstall(run{env: []string{"INSTALL_KELP_VERSION="}})
		if got := s.read(kelp); got != string(fakeKelp("v2.0.0")) {
			t.Errorf("installed %q, want the latest release v2.0.0", got)
		}
	})
	t.Run("channel with busybox wget", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.mustInstall(run{shell: busybox, env: []string{"INSTALL_KELP_VERSION="}})
		if got := s.read(kelp); got != string(fakeKelp("v2.0.0")) {
			t.Errorf("installed %q, want the latest release v2.0.0", got)
		}
	})
	t.Run("neither zstd nor xz", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.mustInstall(run{shell: busybox, without: []string{"xz", "unxz", "xzcat"}})
		if got := s.read(kelp); got != string(fakeKelp("v1.0.0")) {
			t.Errorf("installed %q, want v1.0.0 (uncompressed)", got)
		}
	})
	t.Run("retries", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		out := s.mustInstall(run{env: []string{"INSTALL_KELP_URL=" + s.url + "/flaky/releases/download"}})
		if !strings.Contains(out, "trying again") || s.read(kelp) != string(fakeKelp("v1.0.0")) {
			t.Errorf("no retry, or not installed")
		}
	})
	t.Run("local binary, then skip download", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		local := filepath.Join(s.dir, "my-kelp")
		if err := os.WriteFile(local, fakeKelp("v3.0.0-local"), 0o644); err != nil {
			t.Fatal(err)
		}
		s.mustInstall(run{env: []string{"INSTALL_KELP_BINARY=" + local, "INSTALL_KELP_URL=http://127.0.0.1:1/nowhere"}})
		if got := s.read(kelp); got != string(fakeKelp("v3.0.0-local")) {
			t.Errorf("installed %q, want the local binary", got)
		}
		out := s.mustInstall(run{args: []string{"server", "--debug"}, env: []string{"INSTALL_KELP_SKIP_DOWNLOAD=true", "INSTALL_KELP_URL=http://127.0.0.1:1/nowhere"}})
		if !strings.Contains(out, "using the kelp already installed") || s.read(kelp) != string(fakeKelp("v3.0.0-local")) || s.exists(kelp+".previous") {
			t.Error("skip download changed the binary")
		}
		if !strings.Contains(s.read("/etc/systemd/system/kelp.service"), "server '--debug'") {
			t.Error("the new command did not reach the unit")
		}
	})
	t.Run("bin dir and data dir", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.mustInstall(run{args: []string{"server", "--data-dir", "/var/lib/kelp-other"}, env: []string{"INSTALL_KELP_BIN_DIR=/opt/kelp/bin", "INSTALL_KELP_SYMLINK=skip"}})
		if !strings.Contains(s.read("/etc/systemd/system/kelp.service"), "ExecStart=/opt/kelp/bin/kelp server '--data-dir' '/var/lib/kelp-other'") {
			t.Error("ExecStart does not run /opt/kelp/bin/kelp with the data dir")
		}
		wantWritten(t, s, "/opt/kelp/bin/kelp", "/opt/kelp/bin/kelp-uninstall.sh", "/opt/kelp/bin/kelp-killall.sh",
			"/etc/systemd/system/kelp.service", "/etc/systemd/system/kelp.service.env")
		s.sh("mkdir -p /var/lib/kelp-other/server && echo x >/var/lib/kelp-other/server/state")
		s.resetCalls()
		if _, err := s.uninstall("/opt/kelp/bin/kelp-uninstall.sh"); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, s, "systemctl stop kelp", "kelp killall --data-dir /var/lib/kelp-other", "systemctl disable kelp",
			"systemctl reset-failed kelp", "systemctl daemon-reload")
		if left := s.leftovers(); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	})
	t.Run("read-only /usr/local", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.sh("mount --bind -o ro /usr/local/bin /usr/local/bin")
		out := s.mustInstall(run{})
		if !strings.Contains(out, "read-only") || s.read("/opt/bin/kelp") != string(fakeKelp("v1.0.0")) {
			t.Error("not installed to /opt/bin")
		}
		if !strings.Contains(s.read("/etc/systemd/system/kelp.service"), "ExecStart=/opt/bin/kelp server") {
			t.Error("ExecStart does not run /opt/bin/kelp")
		}
		if _, err := s.uninstall("/opt/bin/kelp-uninstall.sh"); err != nil {
			t.Fatal(err)
		}
		if left := s.leftovers(); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	})
	t.Run("existing kubectl", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.sh("printf '#!/bin/sh\\necho mine\\n' >/usr/local/bin/kubectl && chmod 755 /usr/local/bin/kubectl")
		out := s.mustInstall(run{})
		if s.read("/usr/local/bin/kubectl") != "#!/bin/sh\necho mine\n" || !strings.Contains(out, "leaving /usr/local/bin/kubectl") {
			t.Error("the existing kubectl was not left alone")
		}
		if _, err := s.uninstall("/usr/local/bin/kelp-uninstall.sh"); err != nil {
			t.Fatal(err)
		}
		if left := s.leftovers(); !slices.Equal(left, []string{"/usr/local/bin/kubectl"}) {
			t.Errorf("after uninstall: %q, want only the kubectl that was there", left)
		}
	})
	t.Run("existing kubectl, forced", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.sh("printf '#!/bin/sh\\necho mine\\n' >/usr/local/bin/kubectl && chmod 755 /usr/local/bin/kubectl")
		s.mustInstall(run{env: []string{"INSTALL_KELP_SYMLINK=force"}})
		for _, l := range links {
			if target, _ := os.Readlink(s.hostPath("/usr/local/bin/" + l)); target != kelp {
				t.Errorf("%s -> %q, want kelp", l, target)
			}
		}
	})
}

// TestBadInput checks that each mistake stops install.sh with a clear
// error and nothing installed.
func TestBadInput(t *testing.T) {
	mirror := fakeMirror(t)
	notKelp := "/usr/bin/env"
	for _, c := range []struct {
		name  string
		r     run
		setup func(s *sandbox)
		want  string
	}{
		{name: "unsupported architecture", want: "unsupported architecture mips",
			setup: func(s *sandbox) { s.stub("uname", `[ "$1" = -m ] && echo mips && exit 0; exec /bin/uname "$@"`) }},
		{name: "checksum mismatch", r: run{env: []string{"INSTALL_KELP_VERSION=v6.6.6"}}, want: "checksum mismatch for kelp-linux-amd64.zst"},
		{name: "checksum mismatch, busybox", r: run{shell: busybox, env: []string{"INSTALL_KELP_VERSION=v6.6.6"}}, want: "checksum mismatch for kelp-linux-amd64.xz"},
		{name: "no release", r: run{env: []string{"INSTALL_KELP_VERSION=v0.0.1"}}, want: "cannot download"},
		{name: "http mirror", r: run{env: []string{"INSTALL_KELP_ALLOW_HTTP=false"}}, want: "/releases/download is not an https URL"},
		{name: "http mirror, busybox", r: run{shell: busybox, env: []string{"INSTALL_KELP_ALLOW_HTTP="}}, want: "is not an https URL"},
		{name: "no curl and no wget", r: run{shell: busybox, without: []string{"wget"}}, want: "neither curl nor wget"},
		{name: "not root", r: run{uid: 65534}, want: "must run as root"},
		{name: "not a kelp", r: run{env: []string{"INSTALL_KELP_BINARY=" + notKelp}}, want: notKelp + " is not a kelp binary"},
		{name: "no such binary", r: run{env: []string{"INSTALL_KELP_BINARY=/nonexistent/kelp"}}, want: "no such file"},
		{name: "nothing to skip the download for", r: run{env: []string{"INSTALL_KELP_SKIP_DOWNLOAD=true"}}, want: "no kelp binary at /usr/local/bin/kelp"},
		{name: "check-config fails", r: run{env: []string{"FAKE_KELP_CHECK=fail"}}, want: "FAIL  cgroup memory"},
		{name: "unknown command", r: run{args: []string{"serve"}}, want: "unknown command serve"},
		{name: "agent without token", r: run{args: []string{"agent", "--server", "https://10.0.0.1:6443"}}, want: "needs a join token: on the server, `kelp token create`"},
		{name: "agent without server", r: run{args: []string{"agent", "--token", "x"}}, want: "needs the server to join"},
		{name: "KELP_URL without token", r: run{env: []string{"KELP_URL=https://10.0.0.1:6443"}}, want: "needs KELP_TOKEN too: on the server, `kelp token create`"},
		{name: "relative data dir", r: run{args: []string{"server", "-d", "data"}}, want: "data dir data: use an absolute path"},
		{name: "flag without value", r: run{args: []string{"server", "--token"}}, want: "needs a value"},
		{name: "signature of other checksums", r: run{env: []string{"INSTALL_KELP_VERSION=v6.6.6", "INSTALL_KELP_PUBLIC_KEY=" + filepath.Join(mirror, releaseKey)}},
			want: "signature of sha256sums.txt of v6.6.6 does not match the key"},
		{name: "signature of another key", r: run{env: []string{"INSTALL_KELP_PUBLIC_KEY=" + filepath.Join(mirror, otherKey)}},
			want: "signature of sha256sums.txt of v1.0.0 does not match the key"},
		{name: "no signature", r: run{env: []string{"INSTALL_KELP_VERSION=v2.0.0", "INSTALL_KELP_PUBLIC_KEY=" + filepath.Join(mirror, releaseKey)}},
			want: "sha256sums.txt.sig, the signature INSTALL_KELP_PUBLIC_KEY asks to check"},
		{name: "signature without openssl", r: run{shell: busybox, env: []string{"INSTALL_KELP_PUBLIC_KEY=" + filepath.Join(mirror, releaseKey)}},
			want: "openssl, which checks the release's signature with it, is not installed"},
		{name: "not a public key", r: run{env: []string{"INSTALL_KELP_PUBLIC_KEY=/etc/hostname"}}, want: "/etc/hostname is not an Ed25519 public key"},
		{name: "no public key", r: run{env: []string{"INSTALL_KELP_PUBLIC_KEY=/nonexistent.pem"}}, want: "/nonexistent.pem is not a readable file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t, systemd, mirror)
			if c.setup != nil {
				c.setup(s)
			}
			out, code := s.install(c.r)
			if code != 1 || !strings.Contains(out, c.want) {
				t.Errorf("exit %d, want 1 and %q in:\n%s", code, c.want, out)
			}
			wantWritten(t, s)
			for _, call := range calls(s) {
				if strings.HasPrefix(call, "systemctl") {
					t.Errorf("service manager called: %s", call)
				}
			}
		})
	}
	t.Run("signed release", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		out := s.mustInstall(run{env: []string{"INSTALL_KELP_PUBLIC_KEY=" + filepath.Join(mirror, releaseKey)}})
		if !strings.Contains(out, "sha256sums.txt of v1.0.0 is signed with") || s.read("/usr/local/bin/kelp") != string(fakeKelp("v1.0.0")) {
			t.Errorf("a release signed with the key given was not installed, or not checked:\n%s", out)
		}
	})
	t.Run("check-config skipped", func(t *testing.T) {
		s := newSandbox(t, systemd, mirror)
		s.mustInstall(run{env: []string{"FAKE_KELP_CHECK=fail", "INSTALL_KELP_SKIP_CHECK=true"}})
		if !s.exists("/usr/local/bin/kelp") {
			t.Error("not installed")
		}
	})
}
