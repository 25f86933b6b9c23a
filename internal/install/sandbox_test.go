package install

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// fakeRoots are the directories a sandbox overlays: the host's files show
// through, and whatever the script writes or removes lands in the test's
// upper dir.
var fakeRoots = []string{"/etc", "/usr/local", "/opt", "/var/lib"}

// Service managers a sandbox can pretend to have.
const (
	systemd = "systemd"
	openrc  = "openrc"
	none    = "none"
)

// sandbox is one machine for install.sh: a testcluster node (its own
// network and mount namespaces) with a fake root, stub service manager
// commands and a release mirror on 127.0.0.1.
type sandbox struct {
	t      *testing.T
	n      *testcluster.Node
	dir    string // on the host: overlay upper dirs, stubs, the calls log
	url    string // of the mirror, http://127.0.0.1:port
	calls  string // file the stubs and the fake kelp append their calls to
	stubs  string // directory of the stub commands, first on PATH
	script []byte // install.sh
}

func newSandbox(t *testing.T, manager, mirror string) *sandbox {
	t.Helper()
	testcluster.NeedRoot(t)
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: a comma from the test's name would end the overlay's
	// options. Removed after the node's namespaces, which go first.
	dir, err := os.MkdirTemp("", "kelp-install")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := testcluster.NewNode(t)
	s := &sandbox{t: t, n: n, dir: dir, script: script}
	s.calls = filepath.Join(s.dir, "calls.log")
	s.stubs = filepath.Join(s.dir, "stubs")
	if err := os.WriteFile(s.calls, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	var setup []string
	for _, d := range fakeRoots {
		upper, work := s.upper(d), filepath.Join(s.dir, "work", d)
		for _, p := range []string{upper, work} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		setup = append(setup, fmt.Sprintf("mount -t overlay kelp-install -o lowerdir=%s,upperdir=%s,workdir=%s %s", d, upper, work, d))
	}
	// The overlay of /var/lib hides the node's private kubelet root: mount
	// it again, and a tmpfs for the data dir as on a machine with a disk
	// for it. /run/systemd/system is how the script knows systemd runs.
	setup = append(setup,
		"mount -t tmpfs kelp-test /var/lib/kubelet",
		"mkdir -p /var/lib/kelp", "mount -t tmpfs kelp-test /var/lib/kelp",
		"mkdir -p /run/systemd", "mount -t tmpfs kelp-test /run/systemd")
	stubs := map[string]bool{}
	switch manager {
	case systemd:
		setup = append(setup, "mkdir /run/systemd/system")
		stubs["systemctl"] = true
	case openrc:
		stubs["openrc-run"], stubs["rc-service"], stubs["rc-update"] = true, true, true
	}
	if out, err := n.Run(time.Minute, n.Command("sh", "-ec", strings.Join(setup, "\n"))); err != nil {
		t.Fatalf("fake root: %v\n%s", err, out)
	}
	if err := os.MkdirAll(s.stubs, 0o755); err != nil {
		t.Fatal(err)
	}
	for name := range stubs {
		s.stub(name, "")
	}
	// sync records, besides its arguments, which kelp was installed when
	// it ran: that shows whether a new binary was on disk before its rename.
	s.stub("sync", `echo "  installed: $(grep -o 'kelp v[^ ]*' /usr/local/bin/kelp 2>/dev/null | head -n 1)" >>`+s.calls)
	if mirror != "" {
		l, err := n.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: mirrorHandler(mirror), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		s.url = "http://" + l.Addr().String()
	}
	return s
}

// stub writes a command that records how it was called and then runs
// body, if any.
func (s *sandbox) stub(name, body string) {
	s.t.Helper()
	script := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >>%s\n%s\n", name, s.calls, body)
	if err := os.WriteFile(filepath.Join(s.stubs, name), []byte(script), 0o755); err != nil {
		s.t.Fatal(err)
	}
}

// upper is where the overlay keeps what was written to path.
func (s *sandbox) upper(path string) string {
	return filepath.Join(s.dir, "upper", path)
}

// hostPath is where the test reads path of the fake root: the overlay's
// upper dir for what the script wrote.
func (s *sandbox) hostPath(path string) string {
	for _, d := range fakeRoots {
		if path == d || strings.HasPrefix(path, d+"/") {
			return filepath.Join(s.dir, "upper", path)
		}
	}
	s.t.Fatalf("%s is not in the fake root", path)
	return ""
}

func (s *sandbox) read(path string) string {
	s.t.Helper()
	data, err := os.ReadFile(s.hostPath(path))
	if err != nil {
		s.t.Fatalf("read %s: %v", path, err)
	}
	return string(data)
}

func (s *sandbox) mode(path string) fs.FileMode {
	s.t.Helper()
	fi, err := os.Lstat(s.hostPath(path))
	if err != nil {
		s.t.Fatalf("%s: %v", path, err)
	}
	return fi.Mode()
}

func (s *sandbox) exists(path string) bool {
	_, err := os.Lstat(s.hostPath(path))
	return err == nil
}

// sh runs a shell command inside the sandbox as root.
func (s *sandbox) sh(command string) string {
	s.t.Helper()
	cmd := s.n.Command("sh", "-ec", command)
	cmd.Env = []string{"PATH=" + s.stubs + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "FAKE_KELP_LOG=" + s.calls}
	out, err := s.n.Run(time.Minute, cmd)
	if err != nil {
		s.t.Fatalf("%s: %v\n%s", command, err, out)
	}
	return out
}

// written lists what the script left in the fake root: files, links and
// removals of the host's files (overlay whiteouts), as sorted paths;
// directories, which the overlay copies up as it goes, are left out.
func (s *sandbox) written() []string {
	s.t.Helper()
	var out []string
	for _, d := range fakeRoots {
		root := s.upper(d)
		err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			rel := strings.TrimPrefix(path, filepath.Join(s.dir, "upper"))
			if e.Type()&fs.ModeCharDevice != 0 {
				rel = "removed " + rel
			}
			out = append(out, rel)
			return nil
		})
		if err != nil {
			s.t.Fatal(err)
		}
	}
	sort.Strings(out)
	return out
}

// leftovers lists what is left in the sandbox's tmpfs dirs (data dir,
// kubelet root, /run/kelp) and its fake root after an uninstall.
func (s *sandbox) leftovers(extra ...string) []string {
	s.t.Helper()
	left := s.written()
	dirs := append([]string{"/var/lib/kelp", "/var/lib/kubelet", "/run/kelp"}, extra...)
	out := s.sh("for d in " + strings.Join(dirs, " ") + "; do [ ! -d $d ] || find $d -mindepth 1; done")
	return append(left, strings.Fields(out)...)
}

// callLog is what the stubs and the fake kelp recorded, one call a line.
func (s *sandbox) callLog() []string {
	s.t.Helper()
	data, err := os.ReadFile(s.calls)
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func (s *sandbox) resetCalls() {
	if err := os.WriteFile(s.calls, nil, 0o666); err != nil {
		s.t.Fatal(err)
	}
}

// shells the script is run with: Debian's sh (dash), bash, and busybox
// ash with nothing but busybox's applets on PATH.
const (
	dash    = "dash"
	bash    = "bash"
	busybox = "busybox"
)

// run is one run of install.sh.
type run struct {
	shell string   // dash (default), bash or busybox
	env   []string // on top of the sandbox's defaults; a later one wins
	args  []string // after sh -s -
	uid   int      // 0: root
	// without are commands to leave out of PATH (busybox applets only).
	without []string
}

// install runs install.sh the way `curl … | sh -s - ARGS` does and returns
// its output and exit status.
func (s *sandbox) install(r run) (string, int) {
	s.t.Helper()
	argv := []string{"/usr/bin/dash"}
	path := s.stubs + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	switch r.shell {
	case bash:
		argv = []string{"/bin/bash"}
	case busybox:
		argv = []string{"/usr/bin/busybox", "sh"}
		path = s.stubs + ":" + s.busyboxPath(r.without)
	default:
		if len(r.without) > 0 {
			s.t.Fatal("without needs the busybox shell")
		}
	}
	argv = append(argv, append([]string{"-s", "-"}, r.args...)...)
	var cmd *exec.Cmd
	if r.uid != 0 {
		cmd = s.n.CommandAs(r.uid, r.uid, argv[0], argv[1:]...)
	} else {
		cmd = s.n.Command(argv[0], argv[1:]...)
	}
	cmd.Stdin = bytes.NewReader(s.script)
	cmd.Env = append([]string{
		"PATH=" + path,
		"HOME=/root",
		"FAKE_KELP_LOG=" + s.calls,
		"INSTALL_KELP_URL=" + s.url + "/releases/download",
		"INSTALL_KELP_VERSION=v1.0.0",
		"INSTALL_KELP_ALLOW_HTTP=true", // the mirror is plain http
	}, r.env...)
	start := time.Now()
	out, err := s.n.Run(5*time.Minute, cmd)
	s.t.Logf("install.sh %s (%s, %.1f s):\n%s", strings.Join(r.args, " "), argv[0], time.Since(start).Seconds(), out)
	if err != nil {
		return out, testcluster.ExitCode(err)
	}
	return out, 0
}

// mustInstall runs install.sh and fails the test unless it succeeds.
func (s *sandbox) mustInstall(r run) string {
	s.t.Helper()
	out, code := s.install(r)
	if code != 0 {
		s.t.Fatalf("install.sh exited with %d", code)
	}
	return out
}

// uninstall runs an uninstaller the script wrote, with the fake kelp's
// log in its environment.
func (s *sandbox) uninstall(script string) (string, error) {
	s.t.Helper()
	cmd := s.n.Command(script)
	cmd.Env = []string{"PATH=" + s.stubs + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "FAKE_KELP_LOG=" + s.calls}
	out, err := s.n.Run(2*time.Minute, cmd)
	s.t.Logf("%s:\n%s", script, out)
	return out, err
}

// busyboxPath makes a directory of links to busybox's applets, but for
// those in without, and returns it.
func (s *sandbox) busyboxPath(without []string) string {
	s.t.Helper()
	dir, err := os.MkdirTemp(s.dir, "busybox")
	if err != nil {
		s.t.Fatal(err)
	}
	list, err := exec.Command("busybox", "--list").Output()
	if err != nil {
		s.t.Skipf("busybox: %v (apt-get install busybox)", err)
	}
	skip := map[string]bool{}
	for _, w := range without {
		skip[w] = true
	}
	for _, applet := range strings.Fields(string(list)) {
		if skip[applet] {
			continue
		}
		if err := os.Symlink("/usr/bin/busybox", filepath.Join(dir, applet)); err != nil {
			s.t.Fatal(err)
		}
	}
	return dir
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// fakeKelp is a stand-in for the kelp binary: it prints a version line
// as kelp does and records every call (also through a link, by the name
// it was called as) in $FAKE_KELP_LOG. FAKE_KELP_CHECK=fail makes its
// check-config report a failure.
func fakeKelp(version string) []byte {
	return []byte(`#!/bin/sh
[ -z "${FAKE_KELP_LOG:-}" ] || echo "$(basename "$0") $*" >>"$FAKE_KELP_LOG"
case ${1:-} in
--version) printf 'kelp ` + version + ` (fake)\nkubernetes v1.36.3\n' ;;
check-config)
    if [ "${FAKE_KELP_CHECK:-}" = fail ]; then
        echo "FAIL  cgroup memory          not enabled"
        exit 1
    fi
    echo "ok    cgroup memory          enabled" ;;
esac
`)
}

// release writes the artifacts of one release into dir the way
// scripts/release.sh names them: kelp-linux-ARCH, .zst and .xz, and
// sha256sums.txt listing all of them.
func release(t *testing.T, dir string, binaries map[string][]byte, fast bool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var sums []string
	for arch, bin := range binaries {
		name := "kelp-linux-" + arch
		files := map[string][]byte{name: bin}
		zstdArgs := []string{"-q", "-c", "-19"}
		if fast {
			zstdArgs = []string{"-q", "-c", "-T0", "-3"}
		}
		files[name+".zst"] = compress(t, bin, "zstd", zstdArgs...)
		if !fast {
			files[name+".xz"] = compress(t, bin, "xz", "-c")
		}
		for f, data := range files {
			if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
				t.Fatal(err)
			}
			sums = append(sums, sha(data)+"  "+f)
		}
	}
	sort.Strings(sums)
	if err := os.WriteFile(filepath.Join(dir, "sha256sums.txt"), []byte(strings.Join(sums, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func compress(t *testing.T, data []byte, tool string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(tool, args...)
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v: %s (apt-get install zstd xz-utils)", tool, err, stderr.String())
	}
	return out
}

func sha(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

var (
	fakeMirrorOnce sync.Once
	fakeMirrorDir  string
	fakeMirrorErr  error
)

// fakeMirror is a release mirror of fake kelps, made once per test
// binary: v1.0.0 and v2.0.0 for amd64 and arm64, and v6.6.6 whose
// sha256sums.txt does not match its files. The latest release is v2.0.0.
// v1.0.0 and v6.6.6 are signed by scripts/sign-release.sh with a
// throwaway key, whose public key is releaseKey (and another one's is
// otherKey); v6.6.6's sums were changed after.
func fakeMirror(t *testing.T) string {
	t.Helper()
	fakeMirrorOnce.Do(func() {
		fakeMirrorDir, fakeMirrorErr = os.MkdirTemp("", "kelp-install-mirror")
		if fakeMirrorErr != nil {
			return
		}
		for _, v := range []string{"v1.0.0", "v2.0.0", "v6.6.6"} {
			release(t, filepath.Join(fakeMirrorDir, "releases", "download", v), map[string][]byte{
				"amd64": fakeKelp(v), "arm64": fakeKelp(v + "-arm64"),
			}, false)
		}
		private := filepath.Join(fakeMirrorDir, "release.key")
		if fakeMirrorErr = writeKeys(private, filepath.Join(fakeMirrorDir, releaseKey)); fakeMirrorErr != nil {
			return
		}
		if fakeMirrorErr = writeKeys(filepath.Join(fakeMirrorDir, "other.key"), filepath.Join(fakeMirrorDir, otherKey)); fakeMirrorErr != nil {
			return
		}
		for _, v := range []string{"v1.0.0", "v6.6.6"} {
			cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "sign-release.sh"), private, filepath.Join(fakeMirrorDir, "releases", "download", v))
			if out, err := cmd.CombinedOutput(); err != nil {
				fakeMirrorErr = fmt.Errorf("sign-release.sh: %w\n%s", err, out)
				return
			}
		}
		sums := filepath.Join(fakeMirrorDir, "releases", "download", "v6.6.6", "sha256sums.txt")
		data, err := os.ReadFile(sums)
		if err != nil {
			fakeMirrorErr = err
			return
		}
		fakeMirrorErr = os.WriteFile(sums, tamper(data), 0o644)
	})
	if fakeMirrorErr != nil {
		t.Fatal(fakeMirrorErr)
	}
	return fakeMirrorDir
}

// The public keys in the fake mirror's directory: of the key that signs
// its releases, and of another.
const (
	releaseKey = "release.pub"
	otherKey   = "other.pub"
)

// writeKeys writes a new Ed25519 key pair, PEM, as openssl genpkey and
// openssl pkey -pubout do.
func writeKeys(private, public string) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	if der, err = x509.MarshalPKIXPublicKey(pub); err != nil {
		return err
	}
	return os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
}

// tamper changes the first digit of every checksum in a sha256sums file.
func tamper(sums []byte) []byte {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		first := "0"
		if line[0] == '0' {
			first = "1"
		}
		out = append(out, first+line[1:])
	}
	return []byte(strings.Join(out, "\n") + "\n")
}

// mirrorHandler serves a release mirror from root: files under
// /releases/download/VERSION/, /releases/latest redirecting to the newest
// release as GitHub does, and the same files under /flaky/, where the
// first request for each file fails.
func mirrorHandler(root string) http.Handler {
	files := http.FileServer(http.Dir(root))
	var mu sync.Mutex
	failed := map[string]bool{}
	mux := http.NewServeMux()
	mux.HandleFunc("/releases/latest", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/releases/tag/"+newest(root), http.StatusFound)
	})
	mux.HandleFunc("/releases/tag/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "<html>a release page</html>")
	})
	mux.Handle("/releases/download/", files)
	mux.HandleFunc("/flaky/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		first := !failed[r.URL.Path]
		failed[r.URL.Path] = true
		mu.Unlock()
		if first {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		http.StripPrefix("/flaky", files).ServeHTTP(w, r)
	})
	return mux
}

// newest is the highest-sorting release in root that has good checksums.
func newest(root string) string {
	entries, _ := os.ReadDir(filepath.Join(root, "releases", "download"))
	v := ""
	for _, e := range entries {
		if e.Name() != "v6.6.6" && e.Name() > v {
			v = e.Name()
		}
	}
	return v
}

// sdSplit splits a systemd command line (ExecStart=) into its words:
// single and double quotes, backslash escapes, %% and $$.
func sdSplit(line string) ([]string, error) {
	var words []string
	var word strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\':
			i++
			if i == len(line) {
				return nil, fmt.Errorf("trailing backslash in %q", line)
			}
			word.WriteByte(line[i])
			inWord = true
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '\'' || c == '"'):
			quote = c
			inWord = true
		case quote == 0 && c == ' ':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		case (c == '%' || c == '$') && i+1 < len(line) && line[i+1] == c:
			word.WriteByte(c)
			i++
			inWord = true
		case c == '%' || c == '$':
			return nil, fmt.Errorf("unescaped %c in %q: systemd would expand it", c, line)
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inWord {
		words = append(words, word.String())
	}
	return words, nil
}

// unitValue is the value of the last KEY= line of a unit file.
func unitValue(unit, key string) string {
	v := ""
	for _, line := range strings.Split(unit, "\n") {
		if strings.HasPrefix(line, key+"=") {
			v = strings.TrimPrefix(line, key+"=")
		}
	}
	return v
}

// stopProcess ends a process the test started: SIGTERM, then SIGKILL
// after 30 s.
func stopProcess(cmd *exec.Cmd, done <-chan error) error {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not exit within 30 s of SIGTERM")
	}
}
