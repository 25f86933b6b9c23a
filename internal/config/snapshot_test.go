package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

func TestSnapshotDefaults(t *testing.T) {
	s, err := runServer(t)
	if err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshots
	if snap.Disabled || snap.Retention != 5 || snap.Dir != "" || snap.S3 != nil {
		t.Errorf("defaults: %+v", snap)
	}
	from := time.Date(2026, 11, 23, 1, 30, 0, 0, time.Local)
	if got, want := snap.Schedule.Next(from), time.Date(2026, 11, 23, 12, 0, 0, 0, time.Local); !got.Equal(want) {
		t.Errorf("default schedule: next after %s is %s, want %s", from, got, want)
	}
}

func TestSnapshotFlags(t *testing.T) {
	dir := t.TempDir()
	secretFile := writeFile(t, filepath.Join(dir, "secret"), "file-secret\n")
	caFile := writeFile(t, filepath.Join(dir, "ca.pem"), "")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want func(Snapshots) bool // when parsing succeeds
		err  []string             // parts of the error, when it fails
	}{
		{name: "disabled", args: []string{"--disable-snapshots"},
			want: func(s Snapshots) bool { return s.Disabled }},
		{name: "retention and dir", args: []string{"--snapshot-retention", "2", "--snapshot-dir", "/backup/kelp"},
			want: func(s Snapshots) bool { return s.Retention == 2 && s.Dir == "/backup/kelp" }},
		{name: "descriptor", args: []string{"--snapshot-schedule-cron", "@every 1s"},
			want: func(s Snapshots) bool {
				from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
				return s.Schedule.Next(from).Equal(from.Add(time.Second))
			}},
		{name: "s3 settings ignored without --snapshot-s3", args: []string{"--snapshot-s3-bucket", "b"},
			want: func(s Snapshots) bool { return s.S3 == nil }},
		{name: "s3", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "backups", "--snapshot-s3-folder", "/kelp/prod/",
			"--snapshot-s3-access-key", "AK", "--snapshot-s3-secret-key", "SK", "--snapshot-s3-endpoint", "minio.lan:9000",
			"--snapshot-s3-insecure", "--snapshot-s3-region", "eu-1", "--snapshot-s3-timeout", "30s"},
			want: func(s Snapshots) bool {
				return *s.S3 == S3{Endpoint: "minio.lan:9000", Bucket: "backups", Folder: "kelp/prod", Region: "eu-1",
					AccessKey: "AK", SecretKey: "SK", Insecure: true, Timeout: 30 * time.Second} &&
					s.S3.Location() == "s3://backups/kelp/prod"
			}},
		{name: "s3 defaults", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b"},
			want: func(s Snapshots) bool {
				return s.S3.Endpoint == "s3.amazonaws.com" && !s.S3.Insecure && s.S3.Timeout == 5*time.Minute &&
					s.S3.AccessKey == "" && s.S3.Location() == "s3://b"
			}},
		{name: "keys from the environment", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b"},
			env:  map[string]string{"KELP_SNAPSHOT_S3_ACCESS_KEY": "env-ak", "KELP_SNAPSHOT_S3_SECRET_KEY": "env-sk"},
			want: func(s Snapshots) bool { return s.S3.AccessKey == "env-ak" && s.S3.SecretKey == "env-sk" }},
		{name: "secret key file", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-access-key", "AK", "--snapshot-s3-secret-key-file", secretFile},
			want: func(s Snapshots) bool { return s.S3.SecretKey == "file-secret" }},
		{name: "endpoint CA", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-endpoint-ca", caFile, "--snapshot-s3-skip-ssl-verify"},
			want: func(s Snapshots) bool { return s.S3.EndpointCA == caFile && s.S3.SkipSSLVerify }},

		{name: "bad cron", args: []string{"--snapshot-schedule-cron", "0 */12 * *"},
			err: []string{`--snapshot-schedule-cron "0 */12 * *"`, "want 5 fields", "0 */12 * * *"}},
		{name: "six fields", args: []string{"--snapshot-schedule-cron", "0 0 */12 * * *"}, err: []string{"want 5 fields"}},
		{name: "never", args: []string{"--snapshot-schedule-cron", "0 0 30 2 *"}, err: []string{"never comes"}},
		{name: "retention", args: []string{"--snapshot-retention", "0"}, err: []string{"at least 1", "--disable-snapshots"}},
		{name: "relative dir", args: []string{"--snapshot-dir", "snaps"}, err: []string{"--snapshot-dir", "absolute"}},
		{name: "no bucket", args: []string{"--snapshot-s3"}, err: []string{"--snapshot-s3 needs --snapshot-s3-bucket"}},
		{name: "endpoint URL", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-endpoint", "https://minio.lan"},
			err: []string{"host[:port] without a scheme", "--snapshot-s3-insecure"}},
		{name: "access key alone", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-access-key", "AK"},
			err: []string{"go together", "IAM role"}},
		{name: "secret twice", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-access-key", "AK", "--snapshot-s3-secret-key", "SK", "--snapshot-s3-secret-key-file", secretFile},
			err: []string{"exclude each other"}},
		{name: "missing secret file", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-access-key", "AK", "--snapshot-s3-secret-key-file", filepath.Join(dir, "none")},
			err: []string{"--snapshot-s3-secret-key-file", "no such file"}},
		{name: "missing CA", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-endpoint-ca", filepath.Join(dir, "none.pem")},
			err: []string{"--snapshot-s3-endpoint-ca", "no such file"}},
		{name: "CA over HTTP", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-endpoint-ca", caFile, "--snapshot-s3-insecure"},
			err: []string{"plain HTTP uses no certificates"}},
		{name: "timeout", args: []string{"--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-timeout", "0s"},
			err: []string{"--snapshot-s3-timeout", "positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s, err := runServer(t, tt.args...)
			if tt.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				if !tt.want(s.Snapshots) {
					t.Errorf("got %+v (S3 %+v)", s.Snapshots, s.Snapshots.S3)
				}
				return
			}
			if err == nil {
				t.Fatalf("got %+v, want an error", s.Snapshots)
			}
			for _, w := range tt.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestSnapshotStoreFlagsAlone checks the flags as `kelp snapshot` uses
// them, without the server's.
func TestSnapshotStoreFlagsAlone(t *testing.T) {
	t.Setenv("KELP_SNAPSHOT_S3_SECRET_KEY", "env-sk")
	var in SnapshotStoreInput
	var got SnapshotStore
	app := &cli.App{Commands: []*cli.Command{{
		Name:  "ls",
		Flags: SnapshotStoreFlags(&in),
		Action: func(*cli.Context) error {
			var err error
			got, err = in.Parse()
			return err
		},
	}}}
	if err := app.Run([]string{"kelp", "ls", "--snapshot-dir", "/s", "--snapshot-s3", "--snapshot-s3-bucket", "b", "--snapshot-s3-access-key", "AK"}); err != nil {
		t.Fatal(err)
	}
	if got.Dir != "/s" || got.S3 == nil || got.S3.SecretKey != "env-sk" || got.S3.Bucket != "b" {
		t.Errorf("got %+v (S3 %+v)", got, got.S3)
	}
}
