package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/urfave/cli/v2"
)

// Snapshots is how the server takes snapshots of its datastore on its own.
type Snapshots struct {
	// Disabled is --disable-snapshots.
	Disabled bool
	// Schedule is when a snapshot is taken (--snapshot-schedule-cron).
	Schedule cron.Schedule
	// Retention is how many scheduled snapshots of this node are kept,
	// in the snapshot directory and on S3 each.
	Retention int
	SnapshotStore
}

// SnapshotStore is where snapshots are kept, for the server's schedule and
// for `kelp snapshot` alike.
type SnapshotStore struct {
	// Dir is --snapshot-dir; empty means <data-dir>/server/db/snapshots.
	Dir string
	// S3 is where snapshots are copied off-site; nil without --snapshot-s3.
	S3 *S3
}

// S3 is an S3-compatible bucket that holds copies of the snapshots.
type S3 struct {
	// Endpoint is host[:port], without a scheme.
	Endpoint string
	Bucket   string
	// Folder is the key prefix of the snapshots, without leading or
	// trailing '/'; empty puts them at the top of the bucket.
	Folder string
	// Region is empty where the endpoint is asked for the bucket's region.
	Region string
	// AccessKey and SecretKey are both empty where the credentials come
	// from the machine's IAM role.
	AccessKey, SecretKey string
	// Insecure is plain HTTP instead of HTTPS.
	Insecure bool
	// EndpointCA is a PEM file of CAs trusted besides the system's.
	EndpointCA    string
	SkipSSLVerify bool
	// Timeout bounds each S3 operation: an upload, a listing, a prune, a
	// download.
	Timeout time.Duration
}

// Location is the s3:// URL of the snapshot folder, for messages.
func (s S3) Location() string {
	if s.Folder == "" {
		return "s3://" + s.Bucket
	}
	return "s3://" + s.Bucket + "/" + s.Folder
}

// DefaultSnapshotSchedule takes a snapshot at midnight and noon.
const DefaultSnapshotSchedule = "0 */12 * * *"

// snapshotInput holds the values of the snapshot flags of `kelp server`
// until parse validates them.
type snapshotInput struct {
	SnapshotStoreInput
	disabled  bool
	schedule  string
	retention int
}

func snapshotFlags(in *snapshotInput) []cli.Flag {
	return slices.Concat([]cli.Flag{
		&cli.BoolFlag{Name: "disable-snapshots", EnvVars: env("disable-snapshots"), Destination: &in.disabled, Usage: "take no scheduled snapshots"},
		&cli.StringFlag{Name: "snapshot-schedule-cron", EnvVars: env("snapshot-schedule-cron"), Value: DefaultSnapshotSchedule, Destination: &in.schedule, Usage: "when to take a snapshot: 5-field cron (minute hour day-of-month month day-of-week, in the server's time zone unless CRON_TZ=<zone> leads) or @hourly, @daily, @every 6h"},
		&cli.IntFlag{Name: "snapshot-retention", EnvVars: env("snapshot-retention"), Value: 5, Destination: &in.retention, Usage: "how many scheduled snapshots of this node to keep, locally and on S3 each"},
	}, SnapshotStoreFlags(&in.SnapshotStoreInput))
}

// parse validates the snapshot settings; problems go to check.
func (in *snapshotInput) parse(check func(error)) Snapshots {
	s := Snapshots{Disabled: in.disabled, Retention: in.retention}
	var err error
	s.SnapshotStore, err = in.SnapshotStoreInput.Parse()
	check(err)
	s.Schedule, err = cron.ParseStandard(in.schedule)
	if err != nil {
		check(fmt.Errorf("--snapshot-schedule-cron %q: %v: want 5 fields, minute hour day-of-month month day-of-week, like %q, or a descriptor like @daily or @every 6h", in.schedule, err, DefaultSnapshotSchedule))
	} else if s.Schedule.Next(time.Now()).IsZero() {
		check(fmt.Errorf("--snapshot-schedule-cron %q never comes: pick days that exist", in.schedule))
	}
	if in.retention < 1 {
		check(fmt.Errorf("--snapshot-retention %d: keep at least 1 snapshot; --disable-snapshots turns scheduled snapshots off", in.retention))
	}
	return s
}

// SnapshotStoreInput holds the values of the flags that say where
// snapshots are kept until Parse validates them. `kelp server` and
// `kelp snapshot` share them.
type SnapshotStoreInput struct {
	dir                                 string
	s3, insecure, skipSSLVerify         bool
	endpoint, bucket, folder, region    string
	accessKey, secretKey, secretKeyFile string
	endpointCA                          string
	timeout                             time.Duration
}

// SnapshotStoreFlags returns the --snapshot-dir and --snapshot-s3-* flags,
// bound to in.
func SnapshotStoreFlags(in *SnapshotStoreInput) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "snapshot-dir", EnvVars: env("snapshot-dir"), Destination: &in.dir, Usage: "where snapshots are kept (default: <data-dir>/server/db/snapshots)"},
		&cli.BoolFlag{Name: "snapshot-s3", EnvVars: env("snapshot-s3"), Destination: &in.s3, Usage: "copy snapshots to an S3-compatible bucket too"},
		&cli.StringFlag{Name: "snapshot-s3-endpoint", EnvVars: env("snapshot-s3-endpoint"), Value: "s3.amazonaws.com", Destination: &in.endpoint, Usage: "S3 endpoint, host[:port]"},
		&cli.StringFlag{Name: "snapshot-s3-bucket", EnvVars: env("snapshot-s3-bucket"), Destination: &in.bucket, Usage: "S3 bucket of the snapshots, which must exist"},
		&cli.StringFlag{Name: "snapshot-s3-folder", EnvVars: env("snapshot-s3-folder"), Destination: &in.folder, Usage: "folder (key prefix) of the snapshots in the bucket"},
		&cli.StringFlag{Name: "snapshot-s3-region", EnvVars: env("snapshot-s3-region"), Destination: &in.region, Usage: "region of the bucket (default: asked of the endpoint)"},
		&cli.StringFlag{Name: "snapshot-s3-access-key", EnvVars: env("snapshot-s3-access-key"), Destination: &in.accessKey, Usage: "S3 access key (default: the machine's IAM role)"},
		&cli.StringFlag{Name: "snapshot-s3-secret-key", EnvVars: env("snapshot-s3-secret-key"), Destination: &in.secretKey, Usage: "S3 secret key"},
		&cli.StringFlag{Name: "snapshot-s3-secret-key-file", EnvVars: env("snapshot-s3-secret-key-file"), Destination: &in.secretKeyFile, Usage: "file that holds the S3 secret key, instead of --snapshot-s3-secret-key"},
		&cli.BoolFlag{Name: "snapshot-s3-insecure", EnvVars: env("snapshot-s3-insecure"), Destination: &in.insecure, Usage: "talk plain HTTP to the S3 endpoint"},
		&cli.StringFlag{Name: "snapshot-s3-endpoint-ca", EnvVars: env("snapshot-s3-endpoint-ca"), Destination: &in.endpointCA, Usage: "PEM file of CAs to trust for the S3 endpoint, besides the system's"},
		&cli.BoolFlag{Name: "snapshot-s3-skip-ssl-verify", EnvVars: env("snapshot-s3-skip-ssl-verify"), Destination: &in.skipSSLVerify, Usage: "do not verify the S3 endpoint's certificate"},
		&cli.DurationFlag{Name: "snapshot-s3-timeout", EnvVars: env("snapshot-s3-timeout"), Value: 5 * time.Minute, Destination: &in.timeout, Usage: "time limit of each S3 upload, listing, prune or download"},
	}
}

// Parse validates where snapshots are kept.
func (in *SnapshotStoreInput) Parse() (SnapshotStore, error) {
	st := SnapshotStore{Dir: in.dir}
	if in.dir != "" && !strings.HasPrefix(in.dir, "/") {
		return SnapshotStore{}, fmt.Errorf("--snapshot-dir %q: want an absolute path", in.dir)
	}
	if !in.s3 {
		return st, nil
	}
	var errs []error
	s3 := &S3{
		Endpoint:      in.endpoint,
		Bucket:        in.bucket,
		Folder:        strings.Trim(in.folder, "/"),
		Region:        in.region,
		AccessKey:     in.accessKey,
		SecretKey:     in.secretKey,
		Insecure:      in.insecure,
		EndpointCA:    in.endpointCA,
		SkipSSLVerify: in.skipSSLVerify,
		Timeout:       in.timeout,
	}
	if in.bucket == "" {
		errs = append(errs, errors.New("--snapshot-s3 needs --snapshot-s3-bucket: name the bucket that holds the snapshots"))
	}
	if in.endpoint == "" || strings.Contains(in.endpoint, "/") {
		errs = append(errs, fmt.Errorf("--snapshot-s3-endpoint %q: want host[:port] without a scheme or path, like s3.amazonaws.com or minio.example.com:9000; --snapshot-s3-insecure selects plain HTTP", in.endpoint))
	}
	if in.secretKeyFile != "" {
		if in.secretKey != "" {
			errs = append(errs, errors.New("--snapshot-s3-secret-key and --snapshot-s3-secret-key-file exclude each other: give the secret key once"))
		}
		b, err := os.ReadFile(in.secretKeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--snapshot-s3-secret-key-file: %w", err))
		}
		s3.SecretKey = strings.TrimSpace(string(b))
	}
	if (s3.AccessKey == "") != (s3.SecretKey == "") {
		errs = append(errs, errors.New("--snapshot-s3-access-key and --snapshot-s3-secret-key go together: give both, or neither to use the machine's IAM role"))
	}
	if in.endpointCA != "" {
		if _, err := os.Stat(in.endpointCA); err != nil {
			errs = append(errs, fmt.Errorf("--snapshot-s3-endpoint-ca: %w", err))
		}
		if in.insecure {
			errs = append(errs, errors.New("--snapshot-s3-endpoint-ca and --snapshot-s3-insecure exclude each other: plain HTTP uses no certificates"))
		}
	}
	if in.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--snapshot-s3-timeout %s: want a positive duration like 5m", in.timeout))
	}
	if len(errs) > 0 {
		return SnapshotStore{}, errors.Join(errs...)
	}
	st.S3 = s3
	return st, nil
}
