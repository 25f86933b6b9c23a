// Package testlog lets a test see what kelp logged through logrus.
package testlog

import (
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// Capture records what is logged until the test ends, in place of the
// standard logger's other hooks.
func Capture(t *testing.T) *logtest.Hook {
	t.Helper()
	std := logrus.StandardLogger()
	saved := std.ReplaceHooks(make(logrus.LevelHooks))
	t.Cleanup(func() { std.ReplaceHooks(saved) })
	hook := new(logtest.Hook)
	std.AddHook(hook)
	return hook
}
