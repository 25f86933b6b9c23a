package datastore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	kinetls "github.com/k3s-io/kine/pkg/tls"
	"github.com/sirupsen/logrus"
)

// kine retries a database it cannot reach once a second for five minutes,
// on a context nobody can cancel, and only then fails. checkPostgres and
// checkMySQL connect first, within a bound of their own, so that a wrong
// password fails at once and an unreachable server fails in bounded time.

const remoteAttemptTimeout = 10 * time.Second

// attemptFunc tries one connection; retryable says whether a failed one may
// succeed if tried again.
type attemptFunc func(ctx context.Context) (retryable bool, err error)

func waitForDatabase(ctx context.Context, desc string, timeout time.Duration, try attemptFunc) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, remoteAttemptTimeout)
		retryable, err := try(attempt)
		cancelAttempt()
		if err == nil {
			return nil
		}
		if !retryable {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not accept a connection within %s: %w: check that the database server is running and reachable from this host", desc, timeout, err)
		case <-time.After(time.Second):
		}
	}
}

func isTLSVerifyError(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
	)
	return errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr)
}

func tlsError(desc string, err error) error {
	return fmt.Errorf("%s: TLS verification failed: %w: check --datastore-cafile, --datastore-certfile and --datastore-keyfile", desc, err)
}

// postgresConfig builds the connection settings the way kine's pgsql driver
// does: database "kubernetes" unless named, in lower case, and the
// --datastore-* TLS files as sslrootcert/sslcert/sslkey with verify-full
// unless the endpoint sets them itself.
func postgresConfig(endpoint string, t kinetls.Config) (*pgx.ConnConfig, error) {
	_, rest, _ := strings.Cut(endpoint, "://")
	u, err := url.Parse("postgres://" + rest)
	if err != nil {
		return nil, fmt.Errorf("parse PostgreSQL endpoint %s: use percent-encoding for special characters in the user name or password", Redact(endpoint))
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/kubernetes"
	}
	u.Path = strings.ToLower(u.Path)
	q := u.Query()
	verify := false
	for param, file := range map[string]string{"sslrootcert": t.CAFile, "sslcert": t.CertFile, "sslkey": t.KeyFile} {
		if file != "" && !q.Has(param) {
			q.Set(param, file)
			verify = true
		}
	}
	if verify && !q.Has("sslmode") {
		q.Set("sslmode", "verify-full")
	}
	u.RawQuery = q.Encode()
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("parse PostgreSQL endpoint %s: %w", Redact(endpoint), err)
	}
	return cfg, nil
}

func checkPostgres(ctx context.Context, desc, endpoint string, t kinetls.Config, timeout time.Duration) error {
	cfg, err := postgresConfig(endpoint, t)
	if err != nil {
		return err
	}
	return waitForDatabase(ctx, desc, timeout, func(ctx context.Context) (bool, error) {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			return false, conn.Close(ctx)
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr):
			switch {
			case pgErr.Code == "3D000":
				// The server let us in; kine creates the database.
				return false, nil
			case strings.HasPrefix(pgErr.Code, "28"):
				return false, fmt.Errorf("%s refused the login: %w: check the user name and password in --datastore-endpoint, and pg_hba.conf on the server", desc, err)
			case pgErr.Code == "57P03", pgErr.Code == "53300":
				// Starting up, or out of connection slots.
				return true, err
			default:
				return false, fmt.Errorf("%s: %w", desc, err)
			}
		case isTLSVerifyError(err):
			return false, tlsError(desc, err)
		default:
			return true, err
		}
	})
}

func checkMySQL(ctx context.Context, desc, endpoint string, t kinetls.Config, timeout time.Duration) error {
	_, rest, _ := strings.Cut(endpoint, "://")
	cfg, err := mysql.ParseDSN(rest)
	if err != nil {
		return fmt.Errorf("parse MySQL endpoint %s: %w: the format is mysql://user:password@tcp(host:3306)/database", Redact(endpoint), err)
	}
	// kine creates the database if it is missing; the check is for the server.
	cfg.DBName = ""
	cfg.Timeout = remoteAttemptTimeout
	cfg.Logger = mysqlLogger{}
	tlsCfg, err := t.ClientConfig()
	if err != nil {
		return fmt.Errorf("%s: load TLS files: %w", desc, err)
	}
	if tlsCfg != nil {
		cfg.TLS = tlsCfg
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", desc, err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	return waitForDatabase(ctx, desc, timeout, func(ctx context.Context) (bool, error) {
		err := db.PingContext(ctx)
		if err == nil {
			return false, nil
		}
		var myErr *mysql.MySQLError
		switch {
		case errors.As(err, &myErr):
			switch myErr.Number {
			case 1044, 1045, 1698:
				return false, fmt.Errorf("%s refused the login: %w: check the user name and password in --datastore-endpoint", desc, err)
			case 1040, 1203:
				// Too many connections.
				return true, err
			default:
				return false, fmt.Errorf("%s: %w", desc, err)
			}
		case isTLSVerifyError(err):
			return false, tlsError(desc, err)
		default:
			return true, err
		}
	})
}

// mysqlLogger keeps the MySQL driver's own complaints, which repeat the
// errors it returns, off stderr.
type mysqlLogger struct{}

func (mysqlLogger) Print(v ...any) {
	logrus.WithField("component", "datastore").Debug(v...)
}
