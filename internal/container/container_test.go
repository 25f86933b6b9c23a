package container_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// startTimeout bounds a kelp start, as in the server tests.
const startTimeout = 2 * time.Minute

// stopGrace is how long `docker stop` waits after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// workload is a pod with the volumes the kubelet mounts with tmpfs through
// the image's mount: a Secret and a projected service-account token.
const workload = `
apiVersion: v1
kind: Secret
metadata: {name: credentials}
stringData: {password: s3cret}
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: ` + testcluster.TestImage + `
    imagePullPolicy: IfNotPresent
    args: [serve]
    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
    volumeMounts:
    - {name: credentials, mountPath: /secret}
    - {name: token, mountPath: /token}
  volumes:
  - {name: credentials, secret: {secretName: credentials}}
  - name: token
    projected:
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3600, audience: test}
`

// TestImage runs the image's root filesystem as `docker run --privileged
// --cgroupns=private --tmpfs /run --tmpfs /var/run -v kelp-data:/var/lib/kelp
// kelp` would, until its node is Ready and a pod with a Secret volume runs,
// then stops it as `docker stop` does. The bad inputs are a container
// without /dev/kmsg and one with a read-only /sys/fs/cgroup (both what a
// container gets without --privileged).
func TestImage(t *testing.T) {
	testcluster.NeedRoot(t)
	repo := testcluster.Repository(t)
	img := readDockerfile(t, repo)
	rootfs := buildRootfs(t, repo, img)
	lab := testcluster.NewLab(t)

	t.Run("no /dev/kmsg", func(t *testing.T) {
		c := newContainer(t, lab, "kelp-nokmsg", "10.99.0.3", rootfs, img, options{})
		c.start()
		err := c.waitExit(startTimeout)
		t.Logf("exit: %v; last lines:\n%s", err, c.tail(8))
		if err == nil {
			t.Fatal("kelp exited 0 without /dev/kmsg")
		}
		if !strings.Contains(c.log(), "/dev/kmsg") || !strings.Contains(c.log(), "--privileged") {
			t.Error("kelp's error does not name /dev/kmsg and say to run the container with --privileged")
		}
	})
	t.Run("read-only /sys/fs/cgroup", func(t *testing.T) {
		c := newContainer(t, lab, "kelp-rocgroup", "10.99.0.4", rootfs, img, options{kmsg: true, readOnlyCgroups: true})
		c.start()
		err := c.waitExit(startTimeout)
		t.Logf("exit: %v; last lines:\n%s", err, c.tail(8))
		if err == nil {
			t.Fatal("kelp exited 0 with a read-only /sys/fs/cgroup")
		}
		if !strings.Contains(c.log(), "/sys/fs/cgroup") || !strings.Contains(c.log(), "--privileged") {
			t.Error("kelp's error does not name /sys/fs/cgroup and say to run the container with --privileged")
		}
	})
	t.Run("privileged", func(t *testing.T) {
		c := newContainer(t, lab, "kelp-docker", "10.99.0.2", rootfs, img, options{kmsg: true})
		images := filepath.Join(c.volume("/var/lib/kelp"), "agent", "images")
		if err := os.MkdirAll(images, 0o700); err != nil {
			t.Fatal(err)
		}
		copyFile(t, testcluster.BuildTestImage(t, testcluster.TestImage), filepath.Join(images, "testapp.tar"))
		started := time.Now()
		c.start()
		client := c.client(startTimeout)
		waitNodeReady(t, c, client)
		t.Logf("node Ready %s after start", time.Since(started).Round(time.Second))

		// What a user does with the image: `docker exec kelp kubectl …`.
		testcluster.Eventually(t, "the default service account", func() (bool, error) {
			_, err := client.CoreV1().ServiceAccounts("default").Get(context.Background(), "default", metav1.GetOptions{})
			return err == nil, nil
		})
		c.kubectl(t, workload, "apply", "-f", "-")
		c.kubectl(t, "", "wait", "--for=condition=Ready", "pod/web", "--timeout=90s")
		for file, want := range map[string]string{"/secret/password": "s3cret", "/token/token": "eyJ"} {
			if out := c.kubectl(t, "", "exec", "web", "--", "/testapp", "cat", file); !strings.HasPrefix(out, want) {
				t.Errorf("%s holds %q, want %q first", file, out, want)
			}
		}
		if out := c.kubectl(t, "", "exec", "web", "--", "/testapp", "cat", "/proc/mounts"); !strings.Contains(out, "tmpfs /secret tmpfs") {
			t.Errorf("the Secret volume is not a tmpfs:\n%s", out)
		}
		c.kubectl(t, "", "delete", "pod", "web", "--wait", "--timeout=60s")
		if z := c.zombies(); len(z) > 0 {
			t.Errorf("kelp, PID 1 of the container, leaves zombies: %v", z)
		}

		took, err := c.stop()
		t.Logf("docker stop: kelp exited %v after %s", err, took.Round(100*time.Millisecond))
		if err != nil || took > stopGrace {
			t.Errorf("kelp did not exit cleanly within docker stop's %s: %v after %s", stopGrace, err, took)
		}
	})
}

// buildRootfs runs scripts/rootfs.sh with the kelp binary under test and
// checks that what the Dockerfile names is there.
func buildRootfs(t *testing.T, repo string, img image) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	cmd := exec.Command(filepath.Join(repo, "scripts", "rootfs.sh"), root)
	cmd.Env = append(os.Environ(), "KELP_BIN="+testcluster.Binary(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/rootfs.sh: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(root, img.entrypoint[0])); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("ENTRYPOINT %s is not an executable of the rootfs: %v", img.entrypoint[0], err)
	}
	for _, kv := range img.env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, dir := range filepath.SplitList(path) {
				if fi, err := os.Stat(filepath.Join(root, dir)); err != nil || !fi.IsDir() {
					t.Errorf("PATH has %s, which the rootfs lacks: %v", dir, err)
				}
			}
		}
	}
	for _, v := range img.volumes {
		if entries, err := os.ReadDir(filepath.Join(root, v)); err != nil || len(entries) > 0 {
			t.Errorf("VOLUME %s is not an empty directory of the rootfs: %v %v", v, err, entries)
		}
	}
	var total int64
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	t.Logf("rootfs: %.1f MiB", float64(total)/(1<<20))
	return root
}

// options are what differs between containers.
type options struct {
	kmsg            bool // /dev/kmsg is there, as --privileged gives it
	readOnlyCgroups bool // /sys/fs/cgroup is read-only, as without --privileged
}

// container is one run of the image in a node of the lab: an overlay over
// the rootfs (the container's writable layer), the image's volumes, and
// kelp as PID 1 of its own PID, mount, UTS and IPC namespaces; the node
// gives the network and cgroup namespaces.
type container struct {
	t      *testing.T
	node   *testcluster.Node
	img    image
	name   string // hostname, as docker's --hostname
	dir    string
	merged string // the container's root, in the node's mount namespace
	cmd    *exec.Cmd
	pid    int // PID 1 of the container, as the host sees it
	done   chan error
	exit   error
	exited bool
}

// newContainer makes the node and the container's mounts in it: what
// docker sets up before it starts the entrypoint.
func newContainer(t *testing.T, lab *testcluster.Lab, name, ip, rootfs string, img image, opts options) *container {
	t.Helper()
	c := &container{t: t, node: lab.NewNode(name, ip), img: img, name: name, dir: t.TempDir()}
	c.merged = filepath.Join(c.dir, "merged")
	t.Cleanup(c.cleanup) // before the node's: kelp first, then the namespaces

	q := strconv.Quote
	m := func(p string) string { return q(filepath.Join(c.merged, p)) }
	up, work := filepath.Join(c.dir, "upper"), filepath.Join(c.dir, "work")
	script := []string{
		"set -e",
		"mkdir -p " + q(up) + " " + q(work) + " " + q(c.merged),
		fmt.Sprintf("mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s", rootfs, up, work, q(c.merged)),
	}
	for _, v := range img.volumes {
		script = append(script, "mkdir -p "+q(c.volume(v))+" "+m(v), "mount --bind "+q(c.volume(v))+" "+m(v))
	}
	// --tmpfs /run --tmpfs /var/run: docker resolves /var/run, a link to
	// /run in the image, inside the container, so both are one tmpfs.
	script = append(script, "mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "+m("/run"))
	// /sys of the node's network namespace, and the node's cgroups as the
	// root of the container's (--cgroupns=private).
	script = append(script,
		"mkdir -p "+m("/proc")+" "+m("/sys")+" "+m("/dev"),
		"mount -t sysfs sysfs "+m("/sys"),
		"mount --rbind /sys/fs/cgroup "+m("/sys/fs/cgroup"),
	)
	if opts.readOnlyCgroups {
		script = append(script, `awk -v p=`+m("/sys/fs/cgroup")+` '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo |
			while read -r mp; do mount -o remount,bind,ro "$mp"; done`)
	}
	// A privileged container's /dev holds the host's devices; these are
	// the ones anything in the image opens.
	script = append(script, "mount -t tmpfs -o mode=0755,nosuid tmpfs "+m("/dev"))
	devices := []string{"null", "zero", "full", "random", "urandom", "tty"}
	if opts.kmsg {
		devices = append(devices, "kmsg")
	}
	for _, d := range devices {
		script = append(script, "touch "+m("/dev/"+d), "mount --bind /dev/"+d+" "+m("/dev/"+d))
	}
	script = append(script,
		"mkdir -p "+m("/dev/pts")+" "+m("/dev/shm"),
		"mount -t devpts -o newinstance,ptmxmode=0666 devpts "+m("/dev/pts"),
		"ln -s pts/ptmx "+m("/dev/ptmx"),
		"mount -t tmpfs -o mode=1777,nosuid,nodev shm "+m("/dev/shm"),
		"ln -s /proc/self/fd "+m("/dev/fd"),
		// docker's /etc/hostname, /etc/hosts and /etc/resolv.conf; nothing
		// answers DNS at the node's gateway.
		"mkdir -p "+m("/etc"),
		"echo "+name+" > "+m("/etc/hostname"),
		fmt.Sprintf("printf '127.0.0.1 localhost\\n%s %s\\n' > %s", ip, name, m("/etc/hosts")),
		"echo 'nameserver 10.99.0.1' > "+m("/etc/resolv.conf"),
	)
	if out, err := c.node.Command("sh", "-c", strings.Join(script, "\n")).CombinedOutput(); err != nil {
		t.Fatalf("set up container %s: %v\n%s", name, err, out)
	}
	return c
}

// volume is the host directory behind the image's VOLUME path.
func (c *container) volume(path string) string {
	return filepath.Join(c.dir, "volumes", strings.ReplaceAll(strings.Trim(path, "/"), "/", "-"))
}

// env is the environment docker gives the entrypoint: the image's ENV,
// HOSTNAME, and HOME from the image's /etc/passwd.
func (c *container) env() []string {
	return append(append([]string{}, c.img.env...), "HOSTNAME="+c.name, "HOME=/root")
}

func (c *container) logPath() string { return filepath.Join(c.dir, "kelp.log") }

// start runs ENTRYPOINT + CMD as PID 1 of the container.
func (c *container) start() {
	c.t.Helper()
	self, err := os.Executable()
	if err != nil {
		c.t.Fatal(err)
	}
	logFile, err := os.Create(c.logPath())
	if err != nil {
		c.t.Fatal(err)
	}
	defer logFile.Close()
	args := []string{"--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc", "--", self, c.name, c.merged}
	args = append(append(append(args, c.env()...), "--"), c.img.entrypoint...)
	c.cmd = c.node.Command("unshare", append(args, c.img.cmd...)...)
	c.cmd.Env = append(os.Environ(), containerInitEnv+"=1")
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	if err := testcluster.Spawn(c.cmd); err != nil {
		c.t.Fatalf("start container %s: %v", c.name, err)
	}
	c.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan<- error) { done <- cmd.Wait() }(c.cmd, c.done)
	// The wrapper shell execs nsenter, which execs unshare; its one child
	// is the container's PID 1, containerInit until it execs the
	// entrypoint.
	deadline := time.Now().Add(10 * time.Second)
	for c.pid == 0 {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", c.cmd.Process.Pid, c.cmd.Process.Pid))
		if f := strings.Fields(string(data)); len(f) == 1 {
			c.pid, _ = strconv.Atoi(f[0])
			continue
		}
		if time.Now().After(deadline) || c.hasExited() {
			c.t.Fatalf("container %s has no PID 1: %s", c.name, c.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *container) hasExited() bool {
	if c.exited {
		return true
	}
	select {
	case err := <-c.done:
		c.exit, c.exited = err, true
	default:
	}
	return c.exited
}

// waitExit waits for PID 1 to exit and returns its exit error; it fails
// the test if that takes longer than timeout: a hang.
func (c *container) waitExit(timeout time.Duration) error {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for !c.hasExited() {
		if time.Now().After(deadline) {
			c.t.Fatalf("kelp still running after %s, want it to exit with an error; last lines:\n%s", timeout, c.tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c.exit
}

// stop is `docker stop`: SIGTERM to PID 1, SIGKILL after stopGrace. It
// returns how long PID 1 took and its exit error.
func (c *container) stop() (time.Duration, error) {
	start := time.Now()
	if c.hasExited() {
		return 0, c.exit
	}
	_ = syscall.Kill(c.pid, syscall.SIGTERM)
	for !c.hasExited() {
		if time.Since(start) > stopGrace {
			// unshare --kill-child takes PID 1 along, and with it the
			// whole PID namespace.
			_ = c.cmd.Process.Kill()
			<-c.done
			c.exited, c.exit = true, errors.New("killed after the grace period")
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start), c.exit
}

// cleanup stops the container if the test did not, and shows kelp's log
// if the test failed. The node's cleanup, after it, removes the mounts
// (with the node's mount namespace) and every process left in its cgroups.
func (c *container) cleanup() {
	if c.cmd != nil {
		_, _ = c.stop()
	}
	if c.t.Failed() {
		c.t.Logf("---- container %s: last lines of kelp's log ----\n%s", c.name, c.tail(150))
	}
}

func (c *container) log() string {
	data, _ := os.ReadFile(c.logPath())
	return string(data)
}

func (c *container) tail(n int) string {
	lines := strings.Split(strings.TrimRight(c.log(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// exec is `docker exec`: args run in the container's namespaces and root,
// with the image's environment.
func (c *container) exec(args ...string) *exec.Cmd {
	ns := []string{"--target", strconv.Itoa(c.pid), "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--root", "--wd", "--"}
	cmd := exec.Command("nsenter", append(ns, args...)...)
	cmd.Env = c.env()
	return cmd
}

// kubectl runs the image's kubectl with stdin and returns its output.
func (c *container) kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	cmd := c.exec(append([]string{"kubectl"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("docker exec kubectl %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// client waits for kelp's admin kubeconfig and returns a clientset that
// dials from the node's network namespace.
func (c *container) client(timeout time.Duration) kubernetes.Interface {
	c.t.Helper()
	path := fmt.Sprintf("/proc/%d/root/etc/kelp/kelp.yaml", c.pid)
	var data []byte
	testcluster.EventuallyWithin(c.t, timeout, "kelp to write "+path, func() (bool, error) {
		if c.hasExited() {
			return false, fmt.Errorf("kelp exited: %v", c.exit)
		}
		var err error
		data, err = os.ReadFile(path)
		return err == nil && len(data) > 0, nil
	})
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg.Dial = c.node.DialContext
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return client
}

// zombies lists the dead, unreaped processes of the container's PID
// namespace.
func (c *container) zombies() []string {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", c.pid))
	if err != nil {
		c.t.Fatal(err)
	}
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if other, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); other != ns {
			continue
		}
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		s := string(stat)
		if end := strings.LastIndexByte(s, ')'); end > 0 && strings.HasPrefix(strings.TrimSpace(s[end+1:]), "Z") {
			out = append(out, fmt.Sprintf("%d %s", pid, s[strings.IndexByte(s, '(')+1:end]))
		}
	}
	return out
}

func waitNodeReady(t *testing.T, c *container, client kubernetes.Interface) {
	t.Helper()
	testcluster.EventuallyWithin(t, startTimeout, "node "+c.name+" Ready", func() (bool, error) {
		if c.hasExited() {
			return false, fmt.Errorf("kelp exited: %v", c.exit)
		}
		node, err := client.CoreV1().Nodes().Get(context.Background(), c.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// containerInitEnv makes the test binary containerInit instead of a test.
const containerInitEnv = "KELP_TEST_CONTAINER_INIT"

func TestMain(m *testing.M) {
	if os.Getenv(containerInitEnv) == "1" {
		if err := containerInit(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "container init:", err)
		}
		os.Exit(127)
	}
	os.Exit(m.Run())
}

// containerInit does what runc does between making a container's
// namespaces and starting its entrypoint, with args HOSTNAME ROOT K=V… --
// ENTRYPOINT… CMD…: it runs as PID 1 of new PID, mount, UTS and IPC
// namespaces, mounts their /proc, makes ROOT the root of the mount
// namespace with pivot_root (a chroot would do for kelp, but not for the
// containers it runs: runc exec enters a container at its mount
// namespace's root), and execs the entrypoint with the image's
// environment alone. It returns only on failure.
func containerInit(args []string) error {
	sep := slices.Index(args, "--")
	if len(args) < 3 || sep < 2 || sep == len(args)-1 {
		return fmt.Errorf("usage: HOSTNAME ROOT K=V… -- ENTRYPOINT…, got %q", args)
	}
	name, root, env, argv := args[0], args[1], args[2:sep], args[sep+1:]
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	// pivot_root(".", ".") stacks the old root on the new one; detaching
	// it leaves the new root alone, as runc does it.
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root %s: %w", root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	return unix.Exec(argv[0], argv, env)
}
