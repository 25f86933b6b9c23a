package certrenew

import (
	"fmt"
	"time"
)

// TestLifetimeEnv names the environment variable that shortens the life
// of new leaf certificates. It is for tests only, which see leaves renewed
// and the old ones expire within minutes; kelp's leaves live a year.
const TestLifetimeEnv = "KELP_TEST_LEAF_LIFETIME"

// The range a test lifetime may take: short enough to watch leaves expire,
// long enough for a server to start and its clients to follow.
const (
	minTestLifetime = time.Minute
	maxTestLifetime = 365 * 24 * time.Hour
)

// TestLifetime parses the value of TestLifetimeEnv: zero when it is empty,
// which means kelp's own lifetime.
func TestLifetime(value string) (time.Duration, error) {
	if value == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(value)
	if err != nil || d < minTestLifetime || d > maxTestLifetime {
		return 0, fmt.Errorf("%s=%q: want a duration from %s to %s, such as 4m; it shortens leaf certificates for tests only, so unset it otherwise",
			TestLifetimeEnv, value, minTestLifetime, maxTestLifetime)
	}
	return d, nil
}
