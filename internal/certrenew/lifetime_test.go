package certrenew

import (
	"strings"
	"testing"
	"time"
)

func TestTestLifetime(t *testing.T) {
	for value, want := range map[string]time.Duration{"": 0, "4m": 4 * time.Minute, "1m": time.Minute, "90s": 90 * time.Second, "8760h": 365 * 24 * time.Hour} {
		if got, err := TestLifetime(value); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", value, got, err, want)
		}
	}
	for _, bad := range []string{"4", "four minutes", "-4m", "0", "59s", "8761h", " 4m"} {
		_, err := TestLifetime(bad)
		if err == nil || !strings.Contains(err.Error(), TestLifetimeEnv) || !strings.Contains(err.Error(), "from 1m0s to 8760h0m0s") {
			t.Errorf("%q: %v, want an error that names %s and the range", bad, err, TestLifetimeEnv)
		}
	}
}
