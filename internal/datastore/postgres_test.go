package datastore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// postgresServer runs a throwaway PostgreSQL server for the test and returns
// its port. It skips the test when the server binaries are not installed.
func postgresServer(t *testing.T, password string) int {
	t.Helper()
	initdb, postgres := findPostgres()
	if initdb == "" {
		t.Skip("PostgreSQL server binaries (initdb, postgres) not found; apt-get install postgresql to run this test")
	}

	dir := t.TempDir()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root and there is no postgres user to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		return cmd
	}

	pwfile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pgdata := filepath.Join(dir, "data")
	if out, err := run(initdb, "-D", pgdata, "-U", "kelp", "--pwfile", pwfile, "--auth", "scram-sha-256").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}

	port := freePort(t)
	var logs strings.Builder
	server := run(postgres, "-D", pgdata, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off")
	server.Stdout, server.Stderr = &logs, &logs
	if err := server.Start(); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = server.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		// SIGINT is PostgreSQL's fast shutdown.
		_ = server.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-server.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("postgres log:\n%s", logs.String())
		}
	})

	url := fmt.Sprintf("postgres://kelp:%s@127.0.0.1:%d/postgres", password, port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, url)
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return port
		}
		select {
		case <-exited:
			t.Fatalf("postgres exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres did not come up: %v\n%s", err, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func findPostgres() (initdb, postgres string) {
	if i, err := exec.LookPath("initdb"); err == nil {
		if p, err := exec.LookPath("postgres"); err == nil {
			return i, p
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range dirs {
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "postgres")
		if _, err := os.Stat(i); err == nil {
			if _, err := os.Stat(p); err == nil {
				return i, p
			}
		}
	}
	return "", ""
}

func TestPostgres(t *testing.T) {
	const password = "Pg-s3cret"
	port := postgresServer(t, password)
	dataDir := t.TempDir()
	// No database in the path: kine uses, and creates, "kubernetes".
	cfg := Config{DataDir: dataDir, Endpoint: fmt.Sprintf("postgres://kelp:%s@127.0.0.1:%d/", password, port)}

	t.Run("restart keeps data", func(t *testing.T) {
		d := startReady(t, cfg)
		be := d.Backend()
		if be.Kind != KindPostgres || be.Endpoints[0] != "unix://"+filepath.Join(dataDir, "server", "db", "kine.sock") {
			t.Errorf("Backend = %+v", be)
		}
		put(t, be, "/registry/test/pg", "stored")
		stopWithin(t, d, 30*time.Second)

		d = startReady(t, cfg)
		if got := get(t, d.Backend(), "/registry/test/pg"); got != "stored" {
			t.Errorf("after restart got %q", got)
		}
		stopWithin(t, d, 30*time.Second)
	})

	t.Run("wrong password fails at once", func(t *testing.T) {
		wrong := cfg
		wrong.DataDir = t.TempDir()
		wrong.Endpoint = fmt.Sprintf("postgres://kelp:Wrong-pw@127.0.0.1:%d/kubernetes", port)
		start := time.Now()
		d, err := Start(context.Background(), wrong)
		if err == nil {
			stopWithin(t, d, 30*time.Second)
			t.Fatal("Start succeeded with a wrong password")
		}
		t.Logf("after %s: %v", time.Since(start).Round(time.Millisecond), err)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("a refused login took %s to report", took)
		}
		msg := err.Error()
		for _, want := range []string{"postgres://kelp:***@127.0.0.1", "refused the login", "password"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error does not mention %q", want)
			}
		}
		if strings.Contains(msg, "Wrong-pw") {
			t.Error("error shows the password")
		}
	})

	t.Run("migrate from SQLite and back", func(t *testing.T) {
		dataDir := t.TempDir()
		sqlite := Config{DataDir: dataDir}
		pg := Config{DataDir: dataDir, Endpoint: fmt.Sprintf("postgres://kelp:%s@127.0.0.1:%d/migrated", password, port)}
		d := startReady(t, sqlite)
		fill(t, d.Backend(), 600)
		want, _ := contents(t, d.Backend())
		stopWithin(t, d, 30*time.Second)

		m := migrate(t, sqlite, pg)
		if LocalKind(dataDir) != "" || !strings.Contains(m.Kept, "state.db.before-migrate-") {
			t.Errorf("the SQLite source was not moved aside: %q, kept %q", LocalKind(dataDir), m.Kept)
		}
		if strings.Contains(m.To, password) {
			t.Errorf("the migration names the password: %s", m.To)
		}
		d = startReady(t, pg)
		got, _ := contents(t, d.Backend())
		sameContents(t, "PostgreSQL", got, want)
		stopWithin(t, d, 30*time.Second)

		other := Config{DataDir: t.TempDir()}
		d = startReady(t, other)
		put(t, d.Backend(), "/registry/test/other", "x")
		stopWithin(t, d, 30*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := Migrate(ctx, other, Config{DataDir: other.DataDir, Endpoint: pg.Endpoint}); err == nil || !strings.Contains(err.Error(), "not empty") {
			t.Errorf("migrating into a PostgreSQL database that holds a cluster: %v", err)
		}

		m = migrate(t, pg, sqlite)
		if LocalKind(dataDir) != KindSQLite || m.Kept != "" {
			t.Errorf("after the migration back: %q, kept %q", LocalKind(dataDir), m.Kept)
		}
		d = startReady(t, sqlite)
		got, _ = contents(t, d.Backend())
		sameContents(t, "SQLite from PostgreSQL", got, want)
		stopWithin(t, d, 30*time.Second)
		d = startReady(t, pg)
		got, _ = contents(t, d.Backend())
		sameContents(t, "PostgreSQL after the migration back", got, want)
	})
}
