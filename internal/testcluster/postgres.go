package testcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Postgres is a PostgreSQL server from the Debian package, running inside a
// node's network namespace for the length of a test.
type Postgres struct {
	Password string
	port     int
}

// URL is a --datastore-endpoint for database db.
func (p *Postgres) URL(db string) string {
	return fmt.Sprintf("postgres://kelp:%s@127.0.0.1:%d/%s?sslmode=disable", p.Password, p.port, db)
}

// StartPostgres initialises a database cluster in a temp dir and serves it
// on 127.0.0.1:5432 inside n. It needs the postgresql package
// (scripts/test.sh installs it).
func StartPostgres(t *testing.T, n *Node) *Postgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Fatal("PostgreSQL is not installed: apt-get install -y postgresql (scripts/test.sh does)")
	}
	sort.Strings(bins)
	binDir := filepath.Dir(bins[len(bins)-1])
	owner, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("user postgres: %v", err)
	}
	uid, _ := strconv.Atoi(owner.Uid)
	gid, _ := strconv.Atoi(owner.Gid)

	// PostgreSQL refuses to run as root, and the test's temp dirs are
	// private to root, so it gets a dir of its own.
	dir, err := os.MkdirTemp("", "kelp-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &Postgres{Password: "pw-" + strconv.FormatInt(time.Now().UnixNano(), 36), port: 5432}
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(p.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	for _, path := range []string{dir, pwfile} {
		if err := os.Chown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	asPostgres := func(name string, args ...string) *exec.Cmd {
		cmd := n.CommandAs(uid, gid, filepath.Join(binDir, name), args...)
		cmd.Dir = dir
		return cmd
	}
	out, err := n.Run(2*time.Minute, asPostgres("initdb", "-D", data, "-U", "kelp", "--pwfile", pwfile, "--auth", "scram-sha-256"))
	if err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	logPath := filepath.Join(dir, "postgres.log")
	server := asPostgres("postgres", "-D", data, "-k", dir, "-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-c", "fsync=off")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	server.Stdout, server.Stderr = logFile, logFile
	if err := Spawn(server); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	n.logs = append(n.logs, logPath)
	done := make(chan struct{})
	go func() { _ = server.Wait(); logFile.Close(); close(done) }()
	// Registered after the node's cleanup, so it runs before it: the
	// database stops before the namespaces go.
	t.Cleanup(func() {
		_ = server.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = server.Process.Kill()
			<-done
		}
	})
	Eventually(t, "postgres listens", func() (bool, error) {
		conn, err := n.DialContext(t.Context(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)))
		if err == nil {
			conn.Close()
		}
		return err == nil, err
	})
	return p
}
